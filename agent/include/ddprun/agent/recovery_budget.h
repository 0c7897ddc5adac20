// The recovery budget of each restart on this node (docs/recovery.md): a
// state machine the agent's round loop drives with the phases of a restart,
// timed on the agent's steady clock (the Clock seam, so unit tests run it in
// simulated time).
//
//   Failure ──> Stopped ──> RoundFormed ──> Started ──> FirstStep (recovered)
//
// Each phase is timed once, in milliseconds from Failure. A Failure while a
// record is open (a second failure during recovery) closes it as
// "superseded" and opens a new one; BecameSpare (the job runs on without
// this node) closes it as "spare"; Finish (the job's end) closes an open
// record as "no first step". A phase reported with no record open (the first
// round) is ignored. Not thread-safe: the agent's main thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::agent {

class RecoveryTracker {
 public:
  // The records kept for the failure report (the oldest are dropped).
  static constexpr std::size_t kKept = 8;

  RecoveryTracker(const rendezvous::Clock& clock, std::string job_id);

  // The agent saw a failure of round `round` (a worker's exit, a restart
  // decision heard from the rendezvous, a hang decision) at `detected_at`
  // (now when unset; a worker's exit as the worker group saw it): a new
  // record. Returns the record it closed as superseded, if one was open.
  std::optional<rendezvous::RecoveryBudget> Failure(
      std::int64_t round, std::string cause,
      std::optional<rendezvous::TimePoint> detected_at = std::nullopt);
  // The last local worker of the failed round was reaped.
  void Stopped();
  // The new round's assignment arrived.
  void RoundFormed(std::int64_t round);
  // Every local worker of the new round was spawned.
  void Started();
  // A local rank of the new round completed a step: the record closes as
  // "recovered" and is returned (nullopt when none waits for a step).
  std::optional<rendezvous::RecoveryBudget> FirstStep();
  // The job runs on without this node (it became the hot spare): an open
  // record closes as "spare" and is returned. Its workers have no seat, so
  // no first step comes; the job's budget is that of the nodes that run it.
  std::optional<rendezvous::RecoveryBudget> BecameSpare();
  // The job ends: an open record closes as "no first step" and is returned.
  std::optional<rendezvous::RecoveryBudget> Finish();

  // A record is open and its workers run: the agent looks for their first step.
  bool WaitingForStep() const;
  // How often to look for the first step now: 1 % of the time since the
  // failure, within [10 ms, 1 s], so the figure is late by at most 1 % (or
  // 10 ms) and a job whose workers never count a step costs one look a second.
  rendezvous::Duration StepPollInterval() const;
  bool open() const { return open_; }
  // Every record so far, the newest last (at most kKept), the open one included.
  const std::deque<rendezvous::RecoveryBudget>& records() const { return records_; }
  const std::string& job_id() const { return job_id_; }

 private:
  double SinceFailure() const;
  rendezvous::RecoveryBudget& current() { return records_.back(); }

  const rendezvous::Clock& clock_;
  const std::string job_id_;
  rendezvous::TimePoint failed_at_{};
  bool open_ = false;
  std::deque<rendezvous::RecoveryBudget> records_;
};

// The console line of a closed record, fenced by the job and the new round:
// "[job j round 2] recovered in 1234 ms: detected +0, stopped +12, round +15,
// started +18, first step +1234 (worker rank 1 ... SIGKILL)"; a record that
// did not recover says so and lists the phases it reached.
std::string FormatRecovery(const std::string& job_id, const rendezvous::RecoveryBudget& r);

}  // namespace ddprun::agent
