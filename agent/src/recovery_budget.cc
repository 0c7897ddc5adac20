// RecoveryTracker (recovery_budget.h).
#include "ddprun/agent/recovery_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;

// Sets a phase once: the first report of it counts.
void Mark(double* phase, double ms) {
  if (*phase < 0) *phase = ms;
}

// " stopped +12" or "" for a phase not reached.
std::string Phase(const char* name, double ms) {
  if (ms < 0) return "";
  return absl::StrCat(", ", name, " +", std::llround(ms));
}

}  // namespace

RecoveryTracker::RecoveryTracker(const rdzv::Clock& clock, std::string job_id)
    : clock_(clock), job_id_(std::move(job_id)) {}

double RecoveryTracker::SinceFailure() const {
  return std::chrono::duration<double, std::milli>(clock_.Now() - failed_at_).count();
}

std::optional<rdzv::RecoveryBudget> RecoveryTracker::Failure(
    std::int64_t round, std::string cause, std::optional<rdzv::TimePoint> detected_at) {
  std::optional<rdzv::RecoveryBudget> superseded;
  if (open_) {
    current().outcome = "superseded";
    superseded = current();
  }
  failed_at_ = detected_at ? std::min(*detected_at, clock_.Now()) : clock_.Now();
  open_ = true;
  rdzv::RecoveryBudget r;
  r.failed_round = round;
  r.cause = std::move(cause);
  records_.push_back(std::move(r));
  while (records_.size() > kKept) records_.pop_front();
  return superseded;
}

void RecoveryTracker::Stopped() {
  if (open_) Mark(&current().stopped_ms, SinceFailure());
}

void RecoveryTracker::RoundFormed(std::int64_t round) {
  if (!open_) return;
  // A round that forms without the workers stopped: nothing ran to stop.
  Mark(&current().stopped_ms, SinceFailure());
  if (current().round_ms < 0) current().round = round;
  Mark(&current().round_ms, SinceFailure());
}

void RecoveryTracker::Started() {
  if (open_ && current().round_ms >= 0) Mark(&current().started_ms, SinceFailure());
}

bool RecoveryTracker::WaitingForStep() const { return open_ && records_.back().started_ms >= 0; }

rdzv::Duration RecoveryTracker::StepPollInterval() const {
  using std::chrono::milliseconds;
  return std::clamp<rdzv::Duration>((clock_.Now() - failed_at_) / 100, milliseconds(10),
                                    milliseconds(1000));
}

std::optional<rdzv::RecoveryBudget> RecoveryTracker::FirstStep() {
  if (!WaitingForStep()) return std::nullopt;
  Mark(&current().first_step_ms, SinceFailure());
  current().outcome = "recovered";
  open_ = false;
  return current();
}

std::optional<rdzv::RecoveryBudget> RecoveryTracker::BecameSpare() {
  if (!open_) return std::nullopt;
  current().outcome = "spare";
  open_ = false;
  return current();
}

std::optional<rdzv::RecoveryBudget> RecoveryTracker::Finish() {
  if (!open_) return std::nullopt;
  current().outcome = "no first step";
  open_ = false;
  return current();
}

std::string FormatRecovery(const std::string& job_id, const rdzv::RecoveryBudget& r) {
  const std::string phases =
      absl::StrCat("detected +0", Phase("stopped", r.stopped_ms), Phase("round", r.round_ms),
                   Phase("started", r.started_ms), Phase("first step", r.first_step_ms));
  const std::string fence = rdzv::Fence(job_id, r.round > 0 ? r.round : r.failed_round);
  const std::string from = absl::StrCat(" from round ", r.failed_round, " (", r.cause, ")");
  if (r.outcome == "recovered") {
    return absl::StrCat(fence, "recovered in ", std::llround(r.first_step_ms), " ms: ", phases,
                        " (", r.cause, ")");
  }
  if (r.outcome == "superseded") {
    return absl::StrCat(fence, "recovery", from, " superseded by another failure: ", phases);
  }
  if (r.outcome == "spare") {
    return absl::StrCat(
        fence, "recovery", from,
        " ended: this node became the hot spare, the job runs on without it: ", phases);
  }
  if (r.outcome == "no first step") {
    return absl::StrCat(fence, "recovery", from,
                        " saw no first step before the job ended: ", phases);
  }
  return absl::StrCat(fence, "recovering", from, ": ", phases);
}

}  // namespace ddprun::agent
