// HangDetector in simulated time: every transition of the hang protocol
// (hang_detector.h), driven by explicit time points. No clock, no sleeping,
// no sockets, no hub.
#include "ddprun/rendezvous/monitoring/hang_detector.h"

#include <catch2/catch.hpp>

#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;
using Phase = HangDetector::Phase;
using Step = HangDetector::Step;
using Progress = HangDetector::Progress;

constexpr Duration kStackWait = 5s;
constexpr Duration kDeliveryWait = 2s;
const TimePoint kT0 = TimePoint{} + 1h;

// The detector with the caller's answers to its three questions, counted.
struct Driver {
  Step Tick(Duration since_t0) {
    return d.Tick(
        kT0 + since_t0, [&] { return ++ready_asked, ready; },
        [&] { return ++stalled_asked, stalled; }, [&] { return ++delivered_asked, delivered; });
  }
  HangDetector d{kStackWait, kDeliveryWait};
  bool ready = true;
  bool stalled = false;  // before the first step: some ranks never reached the store
  bool delivered = false;
  int ready_asked = 0;
  int stalled_asked = 0;
  int delivered_asked = 0;
};

TEST_CASE("hang detector: no hang is reported before the timeout", "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.Tick(0s) == Step::kNone);
  CHECK(x.Tick(9s) == Step::kNone);
  CHECK(x.Tick(9999ms) == Step::kNone);
  CHECK(x.ready_asked == 0);  // not asked before the timeout
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.Tick(10s) == Step::kCapture);
  CHECK(x.ready_asked == 1);
  CHECK(x.d.phase() == Phase::kCapturing);
}

TEST_CASE("hang detector: ranks not ready keep it armed", "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  x.ready = false;
  CHECK(x.Tick(10s) == Step::kNone);
  CHECK(x.Tick(60s) == Step::kNone);
  CHECK(x.ready_asked == 2);
  CHECK(x.d.phase() == Phase::kArmed);
  x.ready = true;
  CHECK(x.Tick(61s) == Step::kCapture);
}

TEST_CASE("hang detector: progress restarts the timeout", "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  CHECK(x.d.ObserveProgress(kT0 + 8s) == Progress::kNone);
  CHECK(x.d.last_progress() == kT0 + 8s);
  CHECK(x.Tick(17s) == Step::kNone);
  CHECK(x.Tick(18s) == Step::kCapture);
}

TEST_CASE("hang detector: on_hang=report captures, publishes after the stack wait, re-arms",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  REQUIRE(x.Tick(10s) == Step::kCapture);
  CHECK(x.Tick(14s) == Step::kNone);
  CHECK(x.d.phase() == Phase::kCapturing);
  CHECK(x.Tick(15s) == Step::kPublish);
  CHECK(x.d.phase() == Phase::kReported);
  // Reported once: time alone does nothing more, and nothing is applied.
  CHECK(x.Tick(16s) == Step::kNone);
  CHECK(x.Tick(1000s) == Step::kNone);
  CHECK(x.delivered_asked == 0);
  // Progress re-arms it, and a new stall is a new report.
  CHECK(x.d.ObserveProgress(kT0 + 1001s) == Progress::kRearmed);
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.Tick(1010s) == Step::kNone);
  CHECK(x.Tick(1011s) == Step::kCapture);
}

TEST_CASE("hang detector: every stack in publishes at the next tick", "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  REQUIRE(x.Tick(10s) == Step::kCapture);
  x.d.StacksComplete(kT0 + 11s);
  CHECK(x.Tick(11s) == Step::kPublish);
  // Outside a capture it means nothing.
  x.d.StacksComplete(kT0 + 12s);
  CHECK(x.d.phase() == Phase::kReported);
}

TEST_CASE("hang detector: progress during the capture drops it", "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kRestart);
  REQUIRE(x.Tick(10s) == Step::kCapture);
  CHECK(x.d.ObserveProgress(kT0 + 12s) == Progress::kCaptureDropped);
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.Tick(15s) == Step::kNone);  // the old stack wait's end
  CHECK(x.Tick(21s) == Step::kNone);
  CHECK(x.Tick(22s) == Step::kCapture);
}

TEST_CASE("hang detector: restart and abort apply once every agent has the report",
          "[hang][hang_detector]") {
  for (OnHang action : {OnHang::kRestart, OnHang::kAbort}) {
    Driver x;
    x.d.StartRound(kT0, 10, action);
    REQUIRE(x.Tick(10s) == Step::kCapture);
    CHECK(x.Tick(15s) == Step::kPublish);
    CHECK(x.d.phase() == Phase::kPublished);
    // Progress while published changes nothing: the verdict is out.
    CHECK(x.d.ObserveProgress(kT0 + 15500ms) == Progress::kNone);
    CHECK(x.d.phase() == Phase::kPublished);
    CHECK(x.Tick(16s) == Step::kNone);
    x.delivered = true;
    CHECK(x.Tick(16500ms) == Step::kAct);
    CHECK(x.d.phase() == Phase::kReported);
    CHECK(x.Tick(17s) == Step::kNone);  // applied once
  }
}

TEST_CASE("hang detector: restart and abort apply after the delivery wait without every agent",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kAbort);
  REQUIRE(x.Tick(10s) == Step::kCapture);
  REQUIRE(x.Tick(15s) == Step::kPublish);
  CHECK(x.Tick(16999ms) == Step::kNone);
  CHECK(x.Tick(17s) == Step::kAct);
}

TEST_CASE("hang detector: a closed job is terminal", "[hang][hang_detector]") {
  for (OnHang action : {OnHang::kReport, OnHang::kRestart, OnHang::kAbort}) {
    Driver x;
    x.d.StartRound(kT0, 10, action);
    REQUIRE(x.Tick(10s) == Step::kCapture);
    x.d.Close();
    CHECK(x.d.phase() == Phase::kClosed);
    CHECK(x.d.ObserveProgress(kT0 + 11s) == Progress::kNone);
    x.d.StacksComplete(kT0 + 11s);
    CHECK(x.Tick(11s) == Step::kNone);
    CHECK(x.Tick(1000s) == Step::kNone);
    CHECK(x.d.phase() == Phase::kClosed);
    CHECK(x.ready_asked == 1);
  }
}

TEST_CASE("hang detector: a restart ends the round and a new round starts armed",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kRestart);
  REQUIRE(x.Tick(10s) == Step::kCapture);
  REQUIRE(x.Tick(15s) == Step::kPublish);
  x.delivered = true;
  REQUIRE(x.Tick(15s) == Step::kAct);
  x.d.EndRound();
  CHECK(x.d.phase() == Phase::kArmed);
  // The new round brings its own settings and starts its timer.
  x.d.StartRound(kT0 + 30s, 20, OnHang::kReport);
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.d.last_progress() == kT0 + 30s);
  CHECK(x.Tick(49s) == Step::kNone);
  CHECK(x.Tick(50s) == Step::kCapture);
  CHECK(x.Tick(55s) == Step::kPublish);
  CHECK(x.d.phase() == Phase::kReported);  // report only, this round
  // A round after a close starts armed too.
  x.d.Close();
  x.d.StartRound(kT0 + 100s, 10, OnHang::kReport);
  CHECK(x.d.phase() == Phase::kArmed);
  CHECK(x.Tick(110s) == Step::kCapture);
}

TEST_CASE("hang detector: a timeout of 0 (or less) disables it", "[hang][hang_detector]") {
  for (double timeout : {0.0, -1.0}) {
    Driver x;
    CHECK(x.Tick(1000s) == Step::kNone);  // before any round: off
    x.d.StartRound(kT0, timeout, OnHang::kAbort);
    CHECK(!x.d.enabled());
    CHECK(x.Tick(0s) == Step::kNone);
    CHECK(x.Tick(100000s) == Step::kNone);
    CHECK(x.ready_asked == 0);
    CHECK(x.d.phase() == Phase::kArmed);
  }
}

TEST_CASE("hang detector: a round stuck before its first step is captured as a startup hang",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kAbort);
  x.ready = false;  // no progress source yet: no rank made a first step
  x.stalled = true;
  CHECK(x.Tick(9s) == Step::kNone);
  CHECK(x.stalled_asked == 0);  // not asked before the timeout
  CHECK(x.Tick(10s) == Step::kCapture);
  CHECK(x.stalled_asked == 1);
  CHECK(x.d.cause() == HangDetector::Cause::kStartup);
  CHECK(x.Tick(15s) == Step::kPublish);
  CHECK(x.d.phase() == Phase::kPublished);
  x.delivered = true;
  CHECK(x.Tick(16s) == Step::kAct);  // --on_hang applies as for any hang
}

TEST_CASE("hang detector: a rank slow to start that reaches the store in time is not hung",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kReport);
  x.ready = false;
  x.stalled = false;  // every rank is still starting (a large import): nobody waits
  CHECK(x.Tick(10s) == Step::kNone);
  x.stalled = true;  // the others reached the store; one is still loading
  // It reaches the store at 12 s: the caller reports that as progress.
  CHECK(x.d.ObserveProgress(kT0 + 12s) == Progress::kNone);
  x.stalled = false;
  CHECK(x.Tick(21s) == Step::kNone);
  CHECK(x.Tick(30s) == Step::kNone);
  CHECK(x.d.phase() == Phase::kArmed);
}

TEST_CASE("hang detector: a capture of a startup hang is dropped when a rank arrives",
          "[hang][hang_detector]") {
  Driver x;
  x.d.StartRound(kT0, 10, OnHang::kRestart);
  x.ready = false;
  x.stalled = true;
  CHECK(x.Tick(10s) == Step::kCapture);
  CHECK(x.d.ObserveProgress(kT0 + 11s) == Progress::kCaptureDropped);
  x.stalled = false;
  CHECK(x.Tick(16s) == Step::kNone);
  CHECK(x.d.phase() == Phase::kArmed);
  // Every rank runs with a progress source later and stops: the ordinary cause.
  x.ready = true;
  CHECK(x.Tick(21s) == Step::kCapture);
  CHECK(x.d.cause() == HangDetector::Cause::kNoProgress);
}

}  // namespace
}  // namespace ddprun::rendezvous
