// WaitNotice in simulated time: nothing before 5 s, one line at 5 s with what
// the wait is for, how far it got and until when, then one reminder a minute.
#include "ddprun/rendezvous/common/wait_notice.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST_CASE("a wait says what it waits for after 5 s and reminds every minute", "[wait_notice]") {
  FakeClock clock;
  const TimePoint until = clock.Now() + 600s;
  int joined = 1;
  int asked = 0;
  std::vector<std::string> lines;
  WaitNotice notice(
      clock,
      [&] {
        ++asked;
        return WaitState{"waiting for the other nodes (--nnodes=2)",
                         std::to_string(joined) + " of 2 nodes have joined", until,
                         "exit 3 (--rdzv_conf join_timeout)"};
      },
      [&](const std::string& line) { lines.push_back(line); });
  CHECK(notice.due() == clock.Now() + 5s);
  clock.Advance(4900ms);
  CHECK_FALSE(notice.Poll());
  CHECK(asked == 0);  // the description is made only when a line is due
  clock.Advance(100ms);
  CHECK(notice.Poll());
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("waiting for the other nodes (--nnodes=2): 1 of 2 nodes "
                                         "have joined; until "));
  CHECK_THAT(lines[0], Catch::Contains("(in 595 s), then exit 3 (--rdzv_conf join_timeout)"));
  CHECK_FALSE(notice.Poll());  // once
  CHECK(notice.due() == clock.Now() + 60s);
  clock.Advance(59s);
  CHECK_FALSE(notice.Poll());
  joined = 2;
  clock.Advance(1s);
  CHECK(notice.Poll());
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains("2 of 2 nodes have joined"));
  CHECK_THAT(lines[1], Catch::Contains("(in 535 s)"));
  CHECK(notice.lines() == 2);
}

TEST_CASE("a wait line without progress or consequence, and past its end", "[wait_notice]") {
  FakeClock clock;
  WaitState s{"waiting for node rank 0's store at 10.0.0.1:29500", "", clock.Now() - 1s, ""};
  const std::string line = FormatWaitLine(s, clock.Now());
  CHECK_THAT(line, Catch::StartsWith("waiting for node rank 0's store at 10.0.0.1:29500; "
                                     "until "));
  CHECK_THAT(line, Catch::EndsWith("(in 0 s)"));
}

}  // namespace
}  // namespace ddprun::rendezvous
