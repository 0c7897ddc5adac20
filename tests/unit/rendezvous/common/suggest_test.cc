// The one "did you mean" (suggest.h).
#include "ddprun/rendezvous/common/suggest.h"

#include <catch2/catch.hpp>

namespace rdzv = ddprun::rendezvous;

TEST_CASE("ClosestMatch suggests a near word or an abbreviation, else nothing", "[suggest]") {
  const std::vector<std::string> flags = {"--op", "--json", "--check_timeout", "--port"};
  CHECK(rdzv::ClosestMatch("--opp", flags) == "--op");
  CHECK(rdzv::ClosestMatch("--jsn", flags) == "--json");
  CHECK(rdzv::ClosestMatch("--chek_timeout", flags) == "--check_timeout");
  CHECK(rdzv::ClosestMatch("--prot", flags) == "--port");
  CHECK(rdzv::ClosestMatch("--zzzzzzzz", flags).empty());
  const std::vector<std::string> commands = {"status", "top", "check", "bench"};
  CHECK(rdzv::ClosestMatch("statsu", commands) == "status");
  CHECK(rdzv::ClosestMatch("train.py", commands).empty());
  CHECK(rdzv::ClosestMatch("rdzv", {"job", "rendezvous", "nodes"}) == "rendezvous");
  CHECK(rdzv::DidYouMean("--jsn", flags) == " (did you mean --json?)");
  CHECK(rdzv::DidYouMean("rdzv", {"rendezvous"}, "'") == " (did you mean 'rendezvous'?)");
  CHECK(rdzv::DidYouMean("xyzzy", {"rendezvous"}).empty());
  CHECK(rdzv::EditDistance("kitten", "sitting") == 3);
}
