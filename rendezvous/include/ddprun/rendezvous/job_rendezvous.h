// The round state machine of one job. No gRPC, no threads, no sleeping: the
// caller serialises calls, injects the clock and delivers the Deliveries it
// returns to the agents' streams.
//
// Protocol (one job):
//  1. Agents Join the open round. The first joiner fixes the job's shape
//     (min/max nodes, max_restarts, command, join token); a later joiner
//     that disagrees is refused with a message naming the field. Nodes may
//     run different numbers of workers (nproc), as under torchrun.
//  2. The round completes when max_nodes have joined, or last_call_timeout
//     after min_nodes have joined. Group ranks follow requested ranks
//     (--node_rank) and then (host, pid) order; global ranks are contiguous
//     per node, rank 0 on group rank 0: node i's base rank is the sum of
//     the nproc of nodes 0..i-1, the world size the sum of all, each
//     node's local world size its own nproc. Each member gets its
//     Assignment.
//  3. A member that waits longer than join_timeout in an incomplete round
//     gets DeadlineExceeded and is removed.
//  4. While running, a node that joins becomes a spare if the round is full;
//     otherwise it triggers a scale-up: every member gets RestartRound
//     (not a failure) and the round number increases.
//  5. A member reports FAILED: the job-wide restart count increases. Within
//     max_restarts every member gets RestartRound (a failure); beyond it the
//     job closes and every member gets JobClosed with the failures.
//  6. A member that is lost (stream broke) or leaves: the others get
//     RestartRound (membership change). In a round still gathering it is
//     simply removed.
//  7. When every member reported SUCCEEDED the job closes successfully.
//  Spares are promoted into each new round, up to max_nodes; seats of the
//     previous round's members are held for them while they re-join, except
//     the seat of a node whose worker failed when a spare can take it.
//     When nobody else is awaited (the lost or failed node was the last
//     running one) the promoted spares form the round at once.
//  8. Restart of the server (--state_dir): Snapshot() is persisted on every
//     change of version(); Restore() brings a running round back with its
//     members detached. An agent re-attaches with a resumed Join and gets
//     its Assignment again; a member not back within the reattach timeout is
//     lost (6). A resumed Join for a round that is over gets RestartRound.
//  9. A stream that broke because the server itself could not answer (it was
//     stalled: NodeDetached) detaches its running member the same way, for
//     the caller's hold, instead of losing it (6) at once. A resumed Join is
//     fenced by job (the table's key) and round: only the same node of the
//     running round gets its seat back.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::rendezvous {

class JobRendezvous;

// Everything needed to bring a job back after a server restart.
struct JobSnapshot {
  struct Member {
    std::string node_id;
    JoinSpec spec;
    bool done = false;
  };
  std::string job_id;
  std::string store_token;
  bool shaped = false;
  JoinSpec shape;
  std::string state;  // "gathering", "running", "closed"
  std::int64_t round = 0;
  int restart_count = 0;
  std::vector<Member> members;  // the running round's members
  std::vector<NodeInfo> assigned;
  std::vector<std::string> assigned_ids;
  std::vector<WorkerFailure> failures;
  std::string close_reason;
  bool close_success = false;
  std::vector<std::string> expected;
};

// A message for one agent's stream.
struct Delivery {
  std::string node_id;
  RoundEvent event;
};

// A host whose workers fail this often in one job is quarantined: its agent
// is refused for the cooldown, so the job goes on without it (elastic).
inline constexpr int kDefaultQuarantineFailures = 3;
inline constexpr Duration kDefaultQuarantineCooldown = std::chrono::seconds(300);

struct QuarantinePolicy {
  int failures = kDefaultQuarantineFailures;  // 0 disables quarantine
  Duration cooldown = kDefaultQuarantineCooldown;
};

class JobRendezvous {
 public:
  enum class State { kGathering, kRunning, kClosed };

  JobRendezvous(std::string job_id, const Clock& clock, QuarantinePolicy quarantine = {});

  // Adds a node to the job. Returns the node id under which the caller's
  // stream must be registered; deliveries (possibly for this node) go to out.
  absl::StatusOr<std::string> Join(const JoinSpec& spec, std::vector<Delivery>* out);
  // An agent reports how its round ended. `cause` (kFailed only) says what
  // failed, for the restart's reason and the closing reason ("rank 3 on
  // node-b (pid 4711) hung: ..."); empty: "worker failure on <node>".
  absl::Status Report(const std::string& node_id, std::int64_t round, Outcome outcome,
                      std::vector<WorkerFailure> failures, std::vector<Delivery>* out,
                      const std::string& cause = "");
  // The node's stream broke without a report.
  void NodeLost(const std::string& node_id, std::vector<Delivery>* out);
  // The node's stream broke while the server could not answer its agent (a
  // stalled ddprund, stall_watch.h): a running member that has not finished
  // keeps its seat, detached, until `hold` passes (then it is lost, as by
  // NodeLost); a resumed Join of the same round within it carries on (8).
  // Any other node (gathering round, spare, finished member) is NodeLost.
  // Returns the end of the hold, for the caller's timer; nullopt when the
  // node was not held.
  std::optional<TimePoint> NodeDetached(const std::string& node_id, Duration hold,
                                        std::vector<Delivery>* out);
  // Applies deadlines (last call, join timeout).
  void Tick(std::vector<Delivery>* out);
  // The earliest pending deadline (O(members): for a timer's wake-up).
  std::optional<TimePoint> NextDeadline() const;
  // The earliest deadline that calls added since the last TakeNewDeadline()
  // (a joiner's join timeout, an armed last call, a promoted spare), nullopt
  // if none: O(1), so that a caller's timer learns of it after every call.
  // Deadlines that calls removed are not reported (NextDeadline() drops them);
  // none once the round is no longer gathering (the call that completed it
  // removed them all).
  std::optional<TimePoint> TakeNewDeadline();
  // The server's own verdict on the running round (a hang with
  // --on_hang=abort, metrics_hub.h): records failures and closes the job
  // failed with reason, whatever restart budget is left. FailedPrecondition
  // when round is not the running round.
  absl::Status Abort(std::int64_t round, const std::string& reason,
                     std::vector<WorkerFailure> failures, std::vector<Delivery>* out);

  const std::string& job_id() const { return job_id_; }
  std::int64_t round() const { return round_; }
  State state() const { return state_; }
  const std::string& store_token() const { return store_token_; }
  bool HasNode(const std::string& node_id) const;
  // The first joiner's spec (the job-wide values) and the running round's
  // nodes with their ids, both by group rank (for the metrics hub).
  const JoinSpec& shape() const { return shape_; }
  const std::vector<NodeInfo>& assigned() const { return assigned_; }
  const std::vector<std::string>& assigned_ids() const { return assigned_ids_; }
  JobStatus Status() const;

  // Increases on every change that a restarted server must remember.
  std::uint64_t version() const { return version_; }
  JobSnapshot Snapshot() const;
  // A job as it was; running members are detached until they re-attach or
  // reattach_timeout passes.
  static std::unique_ptr<JobRendezvous> Restore(const JobSnapshot& snap, const Clock& clock,
                                                Duration reattach_timeout);

 private:
  struct Member {
    JoinSpec spec;
    TimePoint joined_at;
    bool done = false;                     // reported SUCCEEDED this round
    std::optional<TimePoint> reattach_by;  // detached (restored, or NodeDetached): lost then
  };
  Assignment AssignmentFor(std::size_t group_rank) const;
  absl::StatusOr<std::string> Resume(const JoinSpec& spec, std::vector<Delivery>* out);
  static std::string NodeIdOf(const JoinSpec& spec);
  absl::Status CheckCompatible(const JoinSpec& spec) const;
  void Complete(std::vector<Delivery>* out);
  // Ends the running round and opens the next; members must re-join. With a
  // failed_node and a hot spare waiting, the spare takes the failed seat.
  void OpenNextRound(const std::string& reason, bool counts_as_failure, std::vector<Delivery>* out,
                     const std::string& failed_node = "");
  // Moves spares into the seats neither taken nor held for a returning
  // member (up to max_nodes); true when it moved one.
  bool PromoteSpares();
  // Completes the gathering round if its conditions hold (or arms the last call).
  void MaybeComplete(std::vector<Delivery>* out);
  // A running member left or was lost: the rest re-rendezvous without it.
  void HandleDeparture(const std::string& node_id, const std::string& reason,
                       std::vector<Delivery>* out);
  void Close(bool success, const std::string& reason, std::vector<Delivery>* out);
  void AddToGathering(const std::string& node_id, const JoinSpec& spec, std::vector<Delivery>* out);
  // Join's second half, once the node's seat request is settled: the node
  // becomes a member (or a spare) of the gathering or running job.
  std::string Admit(const std::string& node_id, const JoinSpec& spec, std::vector<Delivery>* out);
  std::string Prefix() const;
  void NoteDeadline(TimePoint t);
  // The member or spare that requested `rank` (--node_rank), if any: O(log N)
  // through rank_holders_, whose stale entries it drops.
  const Member* RankHolder(int rank);

  const std::string job_id_;
  const Clock& clock_;
  std::string store_token_;
  bool shaped_ = false;
  JoinSpec shape_;  // the first joiner's spec

  State state_ = State::kGathering;
  std::int64_t round_ = 0;
  int restart_count_ = 0;
  std::map<std::string, Member> members_;  // this round's members (gathering or running)
  std::map<std::string, Member> spares_;   // waiting for a place
  std::set<std::string> expected_;         // previous members not yet back
  // requested rank -> the node that last claimed it. Checked against
  // members_ and spares_ when read (RankHolder), so departures need not
  // update it.
  std::map<int, std::string> rank_holders_;
  std::optional<TimePoint> last_call_deadline_;
  std::vector<NodeInfo> assigned_;         // the running round's nodes
  std::vector<std::string> assigned_ids_;  // their node ids, by group rank
  std::string master_addr_;
  int master_port_ = 0;
  std::uint64_t version_ = 0;
  std::optional<TimePoint> new_deadline_;  // see TakeNewDeadline()
  QuarantinePolicy quarantine_;
  std::map<std::string, int> host_failures_;            // failure reports per host
  std::map<std::string, TimePoint> quarantined_until_;  // host -> end of cooldown
  std::vector<WorkerFailure> failures_;                 // every failure so far, first first
  std::string close_reason_;
  bool close_success_ = false;
};

}  // namespace ddprun::rendezvous
