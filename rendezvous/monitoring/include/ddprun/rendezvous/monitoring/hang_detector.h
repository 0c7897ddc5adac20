// The hang protocol of one job (docs/monitoring.md) as a state machine with
// explicit inputs: the round's timeout and --on_hang, progress observations,
// the end of the stack capture, the end of the round, and ticks, each with
// the time it happened. No locks, no threads, no clock of its own: the
// caller (MetricsHub) passes the time in and does what a tick's Step says.
//
//   armed      no progress for the timeout, and the caller's check that the
//              round is stuck before its first step (some ranks never
//              reached the workers' store while others wait there) passes
//              -> kCapture (cause kStartup); or, failing that, its check that
//              every rank is alive with a progress source passes -> kCapture
//              (cause kNoProgress)
//   capturing  the stack wait is over (or StacksComplete) -> kPublish, then
//              reported (--on_hang=report) or published (restart, abort)
//   published  every agent fetched the report, or the delivery wait is over
//              -> kAct, reported
//   reported   progress re-arms it (a capture in flight is dropped too)
//   closed     the job ended: nothing more happens until a new round
//
// A timeout <= 0 disables it: a tick is always kNone.
#pragma once

#include <chrono>

#include "absl/functional/function_ref.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/job_policy.h"

namespace ddprun::rendezvous {

class HangDetector {
 public:
  enum class Phase { kArmed, kCapturing, kPublished, kReported, kClosed };

  // What the caller does after a tick.
  enum class Step {
    kNone,
    kCapture,  // armed -> capturing: name the culprits, ask for their stacks
    kPublish,  // capturing -> reported | published: publish the report, then tick again
    kAct,      // published -> reported: apply --on_hang (restart or abort)
  };

  // Why the last capture started.
  enum class Cause {
    kNoProgress,  // every rank runs with a progress source and none moved
    kStartup,     // no first step: ranks that never reached the store, others waiting
  };

  // What a progress observation did.
  enum class Progress {
    kNone,            // armed (the timer restarts) or published
    kRearmed,         // reported -> armed
    kCaptureDropped,  // capturing -> armed: the report is never sent
  };

  // stack_wait: how long a capture waits for the culprits' stacks;
  // delivery_wait: how long a published restart or abort waits for every
  // agent to fetch the report before it applies.
  HangDetector(Duration stack_wait, Duration delivery_wait);

  // A round starts running at `now`: armed, with this round's settings.
  void StartRound(TimePoint now, double timeout_s, OnHang on_hang);
  // The round ended for a restart: armed for the next StartRound.
  void EndRound();
  // The job closed: nothing more to detect.
  void Close();

  // A rank's steps or collective number moved at `now`.
  Progress ObserveProgress(TimePoint now);
  // Every wanted stack arrived at `now`: a capture publishes at the next tick.
  void StacksComplete(TimePoint now);

  // Time passes. `ranks_ready` (asked only when armed and the timeout has
  // passed): every rank is alive and running, with something that counts
  // progress. `startup_stalled` (asked first, only when armed and the
  // timeout has passed): no rank made a first step, and some
  // ranks never reached the workers' store while others did (a rank that
  // reaches the store is progress: the caller reports it with
  // ObserveProgress). `delivered` (asked only when published): every agent
  // fetched the report.
  Step Tick(TimePoint now, absl::FunctionRef<bool()> ranks_ready,
            absl::FunctionRef<bool()> startup_stalled, absl::FunctionRef<bool()> delivered);

  Phase phase() const { return phase_; }
  // Why the capture in flight (or the last one) started.
  Cause cause() const { return cause_; }
  bool enabled() const { return timeout_s_ > 0; }
  // The last progress (or the round's start).
  TimePoint last_progress() const { return last_progress_; }

 private:
  const Duration stack_wait_;
  const Duration delivery_wait_;
  Phase phase_ = Phase::kArmed;
  double timeout_s_ = 0;
  OnHang on_hang_{};
  Cause cause_ = Cause::kNoProgress;
  TimePoint last_progress_{};
  TimePoint deadline_{};  // end of the stack wait, then of the delivery wait
};

}  // namespace ddprun::rendezvous
