#include "ddprun/rendezvous/monitoring/hang_detector.h"

namespace ddprun::rendezvous {

HangDetector::HangDetector(Duration stack_wait, Duration delivery_wait)
    : stack_wait_(stack_wait), delivery_wait_(delivery_wait), on_hang_(OnHang::kReport) {}

void HangDetector::StartRound(TimePoint now, double timeout_s, OnHang on_hang) {
  phase_ = Phase::kArmed;
  timeout_s_ = timeout_s;
  on_hang_ = on_hang;
  last_progress_ = now;
}

void HangDetector::EndRound() { phase_ = Phase::kArmed; }

void HangDetector::Close() { phase_ = Phase::kClosed; }

HangDetector::Progress HangDetector::ObserveProgress(TimePoint now) {
  if (phase_ == Phase::kClosed) return Progress::kNone;
  last_progress_ = now;
  // A slow rank that moves is not hung.
  if (phase_ == Phase::kCapturing) {
    phase_ = Phase::kArmed;
    return Progress::kCaptureDropped;
  }
  if (phase_ == Phase::kReported) {
    phase_ = Phase::kArmed;
    return Progress::kRearmed;
  }
  return Progress::kNone;
}

void HangDetector::StacksComplete(TimePoint now) {
  if (phase_ == Phase::kCapturing) deadline_ = now;
}

HangDetector::Step HangDetector::Tick(TimePoint now, absl::FunctionRef<bool()> ranks_ready,
                                      absl::FunctionRef<bool()> startup_stalled,
                                      absl::FunctionRef<bool()> delivered) {
  if (!enabled()) return Step::kNone;
  switch (phase_) {
    case Phase::kArmed:
      if (now - last_progress_ < Seconds(timeout_s_)) return Step::kNone;
      // The startup check first: it names the ranks missing from the store,
      // where "every rank stopped at step 0" would name them all.
      if (startup_stalled()) {
        cause_ = Cause::kStartup;
      } else if (ranks_ready()) {
        cause_ = Cause::kNoProgress;
      } else {
        return Step::kNone;
      }
      phase_ = Phase::kCapturing;
      deadline_ = now + stack_wait_;
      return Step::kCapture;
    case Phase::kCapturing:
      if (now < deadline_) return Step::kNone;
      if (on_hang_ == OnHang::kReport) {
        phase_ = Phase::kReported;
      } else {
        // Give every agent time to fetch and print it first.
        phase_ = Phase::kPublished;
        deadline_ = now + delivery_wait_;
      }
      return Step::kPublish;
    case Phase::kPublished:
      if (!delivered() && now < deadline_) return Step::kNone;
      phase_ = Phase::kReported;
      return Step::kAct;
    case Phase::kReported:
    case Phase::kClosed:
      return Step::kNone;
  }
  return Step::kNone;
}

}  // namespace ddprun::rendezvous
