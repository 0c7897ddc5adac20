// The recovery budget's state machine (recovery_budget.h) in simulated time:
// each phase timed from the failure, a restart whose first step never comes,
// and a second failure during recovery.
#include "ddprun/agent/recovery_budget.h"

#include <catch2/catch.hpp>
#include <chrono>

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using std::chrono::milliseconds;

TEST_CASE("recovery budget: each phase in ms from the failure, closed by the first step",
          "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  // Phases before any failure (the first round) make no record.
  t.RoundFormed(1);
  t.Started();
  CHECK_FALSE(t.FirstStep());
  CHECK(t.records().empty());

  CHECK_FALSE(t.Failure(1, "worker rank 1 exited with signal SIGKILL"));
  CHECK(t.open());
  CHECK_FALSE(t.WaitingForStep());
  clock.Advance(milliseconds(12));
  t.Stopped();
  clock.Advance(milliseconds(3));
  t.RoundFormed(2);
  clock.Advance(milliseconds(3));
  t.Started();
  CHECK(t.WaitingForStep());
  clock.Advance(milliseconds(1216));
  auto r = t.FirstStep();
  REQUIRE(r);
  CHECK(r->outcome == "recovered");
  CHECK(r->failed_round == 1);
  CHECK(r->round == 2);
  CHECK(r->stopped_ms == 12);
  CHECK(r->round_ms == 15);
  CHECK(r->started_ms == 18);
  CHECK(r->first_step_ms == 1234);
  CHECK(FormatRecovery("j", *r) ==
        "[job j round 2] recovered in 1234 ms: detected +0, stopped +12, round +15, started +18, "
        "first step +1234 (worker rank 1 exited with signal SIGKILL)");
  // Closed: later steps and the job's end add nothing.
  CHECK_FALSE(t.FirstStep());
  CHECK_FALSE(t.Finish());
  REQUIRE(t.records().size() == 1);
  CHECK(t.records().back().first_step_ms == 1234);
}

TEST_CASE("recovery budget: the first step is looked for within 1 % of the time, 10 ms to 1 s",
          "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  t.Failure(1, "x");
  CHECK(t.StepPollInterval() == milliseconds(10));
  clock.Advance(std::chrono::seconds(3));
  CHECK(t.StepPollInterval() == milliseconds(30));
  clock.Advance(std::chrono::minutes(5));
  CHECK(t.StepPollInterval() == milliseconds(1000));
}

TEST_CASE("recovery budget: each phase is timed once, the first report counts", "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  t.Failure(3, "a node was lost");
  clock.Advance(milliseconds(5));
  t.Stopped();
  clock.Advance(milliseconds(5));
  t.Stopped();  // a second stop (a later escalation) does not move it
  // Started before the round formed is not a phase of this restart.
  t.Started();
  CHECK_FALSE(t.WaitingForStep());
  t.RoundFormed(4);
  t.RoundFormed(5);
  t.Started();
  auto r = t.FirstStep();
  REQUIRE(r);
  CHECK(r->stopped_ms == 5);
  CHECK(r->round == 4);
  CHECK(r->round_ms == 10);
  CHECK(r->started_ms == 10);
  CHECK(r->first_step_ms == 10);
}

TEST_CASE("recovery budget: a round formed with nothing to stop counts as stopped then", "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  t.Failure(2, "the job restarts");
  clock.Advance(milliseconds(7));
  t.RoundFormed(3);
  REQUIRE(t.records().size() == 1);
  CHECK(t.records().back().stopped_ms == 7);
  CHECK(t.records().back().round_ms == 7);
}

TEST_CASE(
    "recovery budget: a first step that never comes is said at the next failure and at "
    "the job's end",
    "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  t.Failure(1, "worker rank 0 exited with exit code 1");
  clock.Advance(milliseconds(10));
  t.Stopped();
  t.RoundFormed(2);
  clock.Advance(milliseconds(10));
  t.Started();
  clock.Advance(std::chrono::seconds(30));

  SECTION("a second failure during recovery closes it as superseded and opens a new record") {
    auto old = t.Failure(2, "worker rank 1 exited with exit code 1");
    REQUIRE(old);
    CHECK(old->outcome == "superseded");
    CHECK(old->first_step_ms < 0);
    CHECK(old->started_ms == 20);
    CHECK(FormatRecovery("j", *old) ==
          "[job j round 2] recovery from round 1 (worker rank 0 exited with exit code 1) "
          "superseded by another failure: detected +0, stopped +10, round +10, started +20");
    REQUIRE(t.records().size() == 2);
    CHECK(t.records().front().outcome == "superseded");
    // The new record times from the second failure.
    clock.Advance(milliseconds(4));
    t.Stopped();
    CHECK(t.records().back().failed_round == 2);
    CHECK(t.records().back().stopped_ms == 4);
    CHECK(t.records().back().outcome == "pending");
  }
  SECTION("the node becoming the hot spare closes it as spare, not as no first step") {
    auto r = t.BecameSpare();
    REQUIRE(r);
    CHECK(r->outcome == "spare");
    CHECK(FormatRecovery("j", *r) ==
          "[job j round 2] recovery from round 1 (worker rank 0 exited with exit code 1) ended: "
          "this node became the hot spare, the job runs on without it: detected +0, stopped +10, "
          "round +10, started +20");
    CHECK_FALSE(t.Finish());
    CHECK_FALSE(t.BecameSpare());
  }
  SECTION("the job's end closes it as no first step") {
    auto r = t.Finish();
    REQUIRE(r);
    CHECK(r->outcome == "no first step");
    CHECK(FormatRecovery("j", *r) ==
          "[job j round 2] recovery from round 1 (worker rank 0 exited with exit code 1) saw no "
          "first step before the job ended: detected +0, stopped +10, round +10, started +20");
    CHECK_FALSE(t.Finish());
  }
}

TEST_CASE("recovery budget: a failure while the round re-forms supersedes before the start",
          "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  t.Failure(1, "a");
  clock.Advance(milliseconds(2));
  t.Stopped();
  auto old = t.Failure(1, "b");  // the round was restarted again while gathering
  REQUIRE(old);
  CHECK(old->round == 0);
  CHECK(old->round_ms < 0);
  CHECK(FormatRecovery("j", *old) ==
        "[job j round 1] recovery from round 1 (a) superseded by another failure: detected +0, "
        "stopped +2");
}

TEST_CASE("recovery budget: only the last kKept records are kept", "[unit]") {
  rdzv::FakeClock clock;
  RecoveryTracker t(clock, "j");
  for (int i = 1; i <= static_cast<int>(RecoveryTracker::kKept) + 3; ++i) t.Failure(i, "x");
  REQUIRE(t.records().size() == RecoveryTracker::kKept);
  CHECK(t.records().front().failed_round == 4);
  CHECK(t.records().back().outcome == "pending");
}

}  // namespace
}  // namespace ddprun::agent
