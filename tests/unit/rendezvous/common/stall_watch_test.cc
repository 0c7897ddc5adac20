// The stall watch in a real child process that the test stops with SIGSTOP
// (as a person or the kernel would): after a stop longer than the threshold
// it says the process was stalled; running freely, it says so no more.
#include "ddprun/rendezvous/common/stall_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

// One byte from fd within timeout_ms; 0 when none came.
char ReadByte(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  char c = 0;
  if (::poll(&p, 1, timeout_ms) == 1 && ::read(fd, &c, 1) == 1) return c;
  return 0;
}

// The child answers each '?' with '1' (StalledRecently) or '0', until its
// input closes.
[[noreturn]] void ChildMain(int in, int out) {
  StallWatch watch;
  char c = 0;
  while (::read(in, &c, 1) == 1) {
    const char answer = watch.StalledRecently() ? '1' : '0';
    if (::write(out, &answer, 1) != 1) break;
  }
  ::_exit(0);
}

TEST_CASE("stall watch: a process stopped for 400 ms knows it was stalled; running, it was not",
          "[unit]") {
  int to_child[2], from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    ChildMain(to_child[0], from_child[1]);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  auto ask = [&] {
    const char q = '?';
    REQUIRE(::write(to_child[1], &q, 1) == 1);
    return ReadByte(from_child[0], 2000);
  };
  // Running freely: not stalled (asked until it says so, 2 s at most: a
  // loaded host may starve the child's first wake-ups).
  auto until_calm = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    char a = ask();
    while (a == '1' && std::chrono::steady_clock::now() - t0 < 2s) {
      std::this_thread::sleep_for(20ms);
      a = ask();
    }
    return a;
  };
  CHECK(until_calm() == '0');
  REQUIRE(::kill(child, SIGSTOP) == 0);
  std::this_thread::sleep_for(400ms);  // the length of the stop is the test
  REQUIRE(::kill(child, SIGCONT) == 0);
  CHECK(ask() == '1');
  // Still within kStallAftermath a moment later (the watch noticed it by now).
  std::this_thread::sleep_for(200ms);
  CHECK(ask() == '1');
  ::close(to_child[1]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  ::close(from_child[0]);
}

}  // namespace
}  // namespace ddprun::rendezvous
