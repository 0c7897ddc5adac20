// ExitStatus::Describe: the names come from glibc (sigabbrev_np).
#include <signal.h>

#include <catch2/catch.hpp>

#include "ddprun/agent/events.h"
#include "ddprun/agent/process_launcher.h"

namespace ddprun::agent {
namespace {

ExitStatus Exited(int code) { return ExitStatus{code, 0}; }
ExitStatus Killed(int sig) { return ExitStatus{0, sig}; }

TEST_CASE("ExitStatus::Describe", "[unit]") {
  CHECK(Exited(0).Describe() == "exit code 0");
  CHECK(Exited(3).Describe() == "exit code 3");
  CHECK(Killed(SIGSEGV).Describe() == "signal SIGSEGV (11)");
  CHECK(Killed(SIGKILL).Describe() == "signal SIGKILL (9)");
  CHECK(Killed(SIGTERM).Describe() == "signal SIGTERM (15)");
  CHECK(Killed(SIGABRT).Describe() == "signal SIGABRT (6)");
  CHECK(Exited(0).ok());
  CHECK_FALSE(Exited(1).ok());
  CHECK_FALSE(Killed(SIGINT).ok());
}

TEST_CASE("signal names for messages", "[unit]") {
  CHECK(SignalName(SIGTERM) == "SIGTERM");
  CHECK(SignalName(SIGUSR1) == "SIGUSR1");
  CHECK(Killed(SIGRTMIN + 2).Describe() ==
        "signal SIGRTMIN+2 (" + std::to_string(SIGRTMIN + 2) + ")");
  CHECK(IsTerminatingSignal(SIGQUIT));
  CHECK_FALSE(IsTerminatingSignal(SIGUSR2));
}

}  // namespace
}  // namespace ddprun::agent
