#include "ddprun/rendezvous/job_rendezvous.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

std::string RandomToken() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token(32, '0');
  for (auto& c : token) c = kHex[rd() % 16];
  return token;
}

}  // namespace

JobRendezvous::JobRendezvous(std::string job_id, const Clock& clock, QuarantinePolicy quarantine)
    : job_id_(std::move(job_id)),
      clock_(clock),
      store_token_(RandomToken()),
      quarantine_(quarantine) {}

const JobRendezvous::Member* JobRendezvous::RankHolder(int rank) {
  auto it = rank_holders_.find(rank);
  if (it == rank_holders_.end()) return nullptr;
  for (const std::map<std::string, Member>* set : {&members_, &spares_}) {
    auto m = set->find(it->second);
    if (m != set->end() && m->second.spec.requested_rank == rank) return &m->second;
  }
  rank_holders_.erase(it);  // that node left
  return nullptr;
}

std::string JobRendezvous::Prefix() const { return Fence(job_id_, round_); }

std::string JobRendezvous::NodeIdOf(const JoinSpec& spec) {
  return spec.host + ":" + std::to_string(spec.pid);
}

bool JobRendezvous::HasNode(const std::string& node_id) const {
  return members_.count(node_id) > 0 || spares_.count(node_id) > 0;
}

absl::Status JobRendezvous::CheckCompatible(const JoinSpec& spec) const {
  if (spec.protocol_version != kProtocolVersion) {
    return absl::InvalidArgumentError(
        Prefix() + "protocol version " + std::to_string(spec.protocol_version) +
        " is not supported (this server speaks " + std::to_string(kProtocolVersion) +
        "); run the same ddprun version on every node");
  }
  if (spec.nproc < 1 || spec.min_nodes < 1 || spec.min_nodes > spec.max_nodes) {
    return absl::InvalidArgumentError(
        Prefix() + "invalid job shape: nproc " + std::to_string(spec.nproc) + ", nnodes " +
        std::to_string(spec.min_nodes) + ":" + std::to_string(spec.max_nodes));
  }
  if (spec.requested_rank >= spec.max_nodes) {
    return absl::InvalidArgumentError(
        Prefix() + "node rank " + std::to_string(spec.requested_rank) +
        " is out of range for --nnodes " + std::to_string(spec.max_nodes) +
        "; use a node rank below the node count");
  }
  if (!shaped_) return absl::OkStatus();
  if (spec.join_token != shape_.join_token) {
    return absl::PermissionDeniedError(Prefix() +
                                       "wrong join token for this job; pass the "
                                       "job's token (--rdzv_conf token=...)");
  }
  auto mismatch = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    return absl::FailedPreconditionError(Prefix() + "this node's " + what + " (" + theirs +
                                         ") differs from the job's (" + ours +
                                         "); start every node of a job with the same " + what);
  };
  // --nproc_per_node may differ between nodes, as under torchrun: each node's
  // LOCAL_WORLD_SIZE is its own, global ranks follow node order (Complete).
  if (spec.min_nodes != shape_.min_nodes || spec.max_nodes != shape_.max_nodes)
    return mismatch("--nnodes",
                    std::to_string(spec.min_nodes) + ":" + std::to_string(spec.max_nodes),
                    std::to_string(shape_.min_nodes) + ":" + std::to_string(shape_.max_nodes));
  if (spec.policy.max_restarts != shape_.policy.max_restarts)
    return mismatch("--max_restarts", std::to_string(spec.policy.max_restarts),
                    std::to_string(shape_.policy.max_restarts));
  if (spec.command != shape_.command) return mismatch("command", spec.command, shape_.command);
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobRendezvous::Join(const JoinSpec& spec, std::vector<Delivery>* out) {
  if (state_ == State::kClosed) {
    return ClosedError(Prefix() + "the job is closed (" + close_reason_ +
                       "); start a new job with a different --rdzv_id");
  }
  DDPRUN_RETURN_IF_ERROR(CheckCompatible(spec));
  if (spec.resume_round >= 0) return Resume(spec, out);
  if (auto q = quarantined_until_.find(spec.host); q != quarantined_until_.end()) {
    const TimePoint now = clock_.Now();
    if (now < q->second) {
      // The others do not wait for it.
      if (expected_.erase(NodeIdOf(spec)) > 0) MaybeComplete(out);
      const auto left = std::chrono::duration_cast<std::chrono::seconds>(q->second - now).count();
      return absl::FailedPreconditionError(
          Prefix() + "host " + spec.host + " is quarantined for " + std::to_string(left + 1) +
          " more s after " + std::to_string(host_failures_[spec.host]) +
          " worker failures in this job; fix the host, or wait and re-join");
    }
    quarantined_until_.erase(q);
    host_failures_.erase(spec.host);
  }
  const std::string node_id = NodeIdOf(spec);
  if (HasNode(node_id)) {
    return absl::AlreadyExistsError(Prefix() + "agent " + node_id +
                                    " is already a member of this job");
  }
  // --node_rank is a preference under c10d (torchrun ignores it): a rank
  // another member holds falls back to arrival order; the agent says so when
  // its assignment differs from what it asked for.
  JoinSpec seat = spec;
  if (seat.requested_rank >= 0) {
    if (RankHolder(seat.requested_rank) != nullptr) {
      seat.requested_rank = -1;
    } else {
      // A join refused below leaves a stale entry, which RankHolder drops.
      rank_holders_[seat.requested_rank] = node_id;
    }
  }
  return Admit(node_id, seat, out);
}

std::string JobRendezvous::Admit(const std::string& node_id, const JoinSpec& spec,
                                 std::vector<Delivery>* out) {
  if (!shaped_) {
    shaped_ = true;
    shape_ = spec;
    ++version_;  // a restarted server keeps the job and the policy it fixed
  }
  expected_.erase(node_id);
  if (state_ == State::kRunning) {
    Member m{spec, clock_.Now(), false, std::nullopt};
    if (static_cast<int>(members_.size()) >= shape_.max_nodes) {
      spares_.emplace(node_id, std::move(m));  // a hot spare, promoted on the next round
      return node_id;
    }
    // Scale-up: the running members re-join the next round with the newcomer.
    OpenNextRound("node " + node_id + " joined", /*counts_as_failure=*/false, out);
    AddToGathering(node_id, spec, out);
    return node_id;
  }
  AddToGathering(node_id, spec, out);
  return node_id;
}

void JobRendezvous::AddToGathering(const std::string& node_id, const JoinSpec& spec,
                                   std::vector<Delivery>* out) {
  // Seats of the previous round's members that are still coming back are
  // held for them (the caller already removed node_id from expected_).
  if (static_cast<int>(members_.size() + expected_.size()) >= shape_.max_nodes) {
    spares_.emplace(node_id, Member{spec, clock_.Now(), false, std::nullopt});
    return;
  }
  members_.emplace(node_id, Member{spec, clock_.Now(), false, std::nullopt});
  NoteDeadline(clock_.Now() + Seconds(spec.policy.join_timeout_s));
  MaybeComplete(out);
}

void JobRendezvous::MaybeComplete(std::vector<Delivery>* out) {
  if (state_ != State::kGathering) return;
  const int n = static_cast<int>(members_.size());
  if (n >= shape_.max_nodes) {
    Complete(out);
    return;
  }
  if (n < shape_.min_nodes) {
    last_call_deadline_.reset();
    return;
  }
  // Enough nodes. Members of the previous round are re-joining after a
  // restart: complete as soon as the last of them is back, without waiting
  // for the last call.
  if (round_ > 0 && expected_.empty()) {
    Complete(out);
    return;
  }
  if (!last_call_deadline_) {
    last_call_deadline_ = clock_.Now() + Seconds(shape_.policy.last_call_timeout_s);
    NoteDeadline(*last_call_deadline_);
  }
}

void JobRendezvous::Complete(std::vector<Delivery>* out) {
  struct Entry {
    int requested;
    std::string host;
    std::int64_t pid;
    std::string id;
  };
  std::vector<Entry> order;
  order.reserve(members_.size());
  for (const auto& [id, m] : members_) {
    order.push_back({m.spec.requested_rank < 0 ? INT32_MAX : m.spec.requested_rank, m.spec.host,
                     m.spec.pid, id});
  }
  std::sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.requested, a.host, a.pid) < std::tie(b.requested, b.host, b.pid);
  });
  // Seats are kept when the job keeps its size: a member of the previous
  // round (assigned_ids_ still holds it) keeps its group rank, hence its
  // RANKs and the checkpoint memory its agent holds for them (also when it
  // asked for another with --node_rank: a preference, honoured in the round
  // it joined). Newcomers (a promoted spare, a node that re-joined) take the
  // free seat they asked for, then the free seats in the order above. A job
  // that grew or shrank takes the order above (its checkpoints no longer
  // match seats anyway).
  if (assigned_ids_.size() == order.size()) {
    std::vector<std::optional<Entry>> seats(order.size());
    std::vector<Entry> newcomers;
    for (const Entry& e : order) {
      const auto prev = std::find(assigned_ids_.begin(), assigned_ids_.end(), e.id);
      const auto seat = static_cast<std::size_t>(prev - assigned_ids_.begin());
      if (prev != assigned_ids_.end() && seat < seats.size() && !seats[seat]) {
        seats[seat] = e;
      } else {
        newcomers.push_back(e);
      }
    }
    std::vector<Entry> unplaced;
    for (const Entry& e : newcomers) {
      const auto want = static_cast<std::size_t>(e.requested);
      if (e.requested != INT32_MAX && want < seats.size() && !seats[want]) {
        seats[want] = e;
      } else {
        unplaced.push_back(e);
      }
    }
    std::size_t next = 0;
    for (auto& s : seats) {
      if (!s) s = unplaced[next++];
    }
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = *seats[i];
  }
  assigned_.clear();
  int base = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Member& m = members_.at(order[i].id);
    assigned_.push_back(NodeInfo{static_cast<int>(i), m.spec.host, m.spec.pid, m.spec.nproc, base});
    base += m.spec.nproc;
  }
  state_ = State::kRunning;
  last_call_deadline_.reset();
  expected_.clear();
  assigned_ids_.clear();
  for (const auto& e : order) assigned_ids_.push_back(e.id);
  const Member& master = members_.at(order[0].id);
  master_addr_ = master.spec.host;
  master_port_ = master.spec.master_port;
  ++version_;
  for (std::size_t i = 0; i < order.size(); ++i) out->push_back({order[i].id, AssignmentFor(i)});
}

Assignment JobRendezvous::AssignmentFor(std::size_t i) const {
  Assignment a;
  a.job_id = job_id_;
  a.round = round_;
  a.group_rank = static_cast<int>(i);
  a.group_world_size = static_cast<int>(assigned_.size());
  a.base_rank = assigned_[i].base_rank;
  a.world_size = assigned_.back().base_rank + assigned_.back().nproc;
  a.local_world_size = assigned_[i].nproc;
  a.master_addr = master_addr_;
  a.master_port = master_port_;
  a.restart_count = restart_count_;
  a.store_token = store_token_;
  a.node_id = assigned_ids_[i];
  a.policy = shape_.policy;
  return a;
}

absl::StatusOr<std::string> JobRendezvous::Resume(const JoinSpec& spec,
                                                  std::vector<Delivery>* out) {
  const std::string& node_id = spec.resume_node_id;
  if (state_ == State::kRunning && spec.resume_round == round_) {
    auto it = members_.find(node_id);
    if (it != members_.end()) {
      it->second.reattach_by.reset();
      for (std::size_t i = 0; i < assigned_ids_.size(); ++i) {
        if (assigned_ids_[i] == node_id) out->push_back({node_id, AssignmentFor(i)});
      }
      return node_id;
    }
  }
  if (spec.resume_round > round_) {
    return absl::FailedPreconditionError(
        Prefix() + "agent " + node_id + " resumes round " + std::to_string(spec.resume_round) +
        ", which this server never reached; was ddprund restarted without its --state_dir?");
  }
  // The job moved on while the agent was away: it must join the next round.
  out->push_back({node_id, RestartRound{round_,
                                        "the job moved on while this agent was "
                                        "disconnected from the rendezvous",
                                        false}});
  return node_id;
}

void JobRendezvous::OpenNextRound(const std::string& reason, bool counts_as_failure,
                                  std::vector<Delivery>* out, const std::string& failed_node) {
  ++round_;
  ++version_;
  for (const auto& [id, m] : members_) {
    out->push_back({id, RestartRound{round_, reason, counts_as_failure}});
    expected_.insert(id);
  }
  members_.clear();
  assigned_.clear();
  state_ = State::kGathering;
  last_call_deadline_.reset();
  // A hot spare takes the failed node's seat: the round does not wait for
  // the failed node, which becomes a spare if it comes back to a full round.
  if (!failed_node.empty() && !spares_.empty()) expected_.erase(failed_node);
  // Promoted spares do not join again: when nobody else is awaited (the
  // failed or lost node was the only one) they form the round now.
  if (PromoteSpares()) MaybeComplete(out);
}

bool JobRendezvous::PromoteSpares() {
  // Into the seats not held for returning members.
  bool promoted = false;
  while (!spares_.empty() &&
         static_cast<int>(members_.size() + expected_.size()) < shape_.max_nodes) {
    auto it = spares_.begin();
    members_.emplace(it->first, Member{it->second.spec, clock_.Now(), false, std::nullopt});
    NoteDeadline(clock_.Now() + Seconds(it->second.spec.policy.join_timeout_s));
    spares_.erase(it);
    promoted = true;
  }
  return promoted;
}

void JobRendezvous::Close(bool success, const std::string& reason, std::vector<Delivery>* out) {
  state_ = State::kClosed;
  ++version_;
  close_success_ = success;
  close_reason_ = reason;
  JobClosed closed{success, reason, failures_};
  for (const auto& [id, m] : members_) out->push_back({id, closed});
  for (const auto& [id, m] : spares_) out->push_back({id, closed});
  members_.clear();
  spares_.clear();
  expected_.clear();
  last_call_deadline_.reset();
}

absl::Status JobRendezvous::Abort(std::int64_t round, const std::string& reason,
                                  std::vector<WorkerFailure> failures, std::vector<Delivery>* out) {
  if (state_ != State::kRunning || round != round_) {
    return absl::FailedPreconditionError(Prefix() + "cannot abort round " + std::to_string(round) +
                                         ": it is not running");
  }
  for (auto& f : failures) {
    f.round = round_;
    failures_.push_back(std::move(f));
  }
  Close(false, reason, out);
  return absl::OkStatus();
}

absl::Status JobRendezvous::Report(const std::string& node_id, std::int64_t round, Outcome outcome,
                                   std::vector<WorkerFailure> failures, std::vector<Delivery>* out,
                                   const std::string& cause) {
  if (state_ == State::kClosed) return absl::OkStatus();  // late reports change nothing
  if (round != round_) {
    return absl::FailedPreconditionError(Prefix() + "report from agent " + node_id +
                                         " is for round " + std::to_string(round) +
                                         ", which is over; the agent is stale and must re-join");
  }
  auto it = members_.find(node_id);
  if (it == members_.end() || state_ != State::kRunning) {
    if (spares_.erase(node_id) > 0) return absl::OkStatus();
    return absl::FailedPreconditionError(Prefix() + "agent " + node_id +
                                         " is not a member of the running round");
  }
  switch (outcome) {
    case Outcome::kSucceeded: {
      it->second.done = true;
      ++version_;
      bool all_done = std::all_of(members_.begin(), members_.end(),
                                  [](const auto& kv) { return kv.second.done; });
      if (all_done) Close(true, "every worker succeeded", out);
      return absl::OkStatus();
    }
    case Outcome::kFailed: {
      for (auto& f : failures) {
        f.round = round_;
        failures_.push_back(std::move(f));
      }
      ++restart_count_;
      const std::string& host = it->second.spec.host;
      if (quarantine_.failures > 0 && ++host_failures_[host] >= quarantine_.failures) {
        quarantined_until_[host] = clock_.Now() + quarantine_.cooldown;
      }
      if (restart_count_ > shape_.policy.max_restarts) {
        Close(false,
              (cause.empty() ? std::string("a worker failed") : cause) +
                  " and the restart budget (" + std::to_string(shape_.policy.max_restarts) +
                  ") is spent",
              out);
        return absl::OkStatus();
      }
      std::string reason = (cause.empty() ? "worker failure on " + node_id : cause) + " (restart " +
                           std::to_string(restart_count_) + " of " +
                           std::to_string(shape_.policy.max_restarts) + ")";
      OpenNextRound(reason, /*counts_as_failure=*/true, out, /*failed_node=*/node_id);
      return absl::OkStatus();
    }
    case Outcome::kLeaving:
      members_.erase(it);
      HandleDeparture(node_id, "agent " + node_id + " left", out);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void JobRendezvous::HandleDeparture(const std::string& node_id, const std::string& reason,
                                    std::vector<Delivery>* out) {
  // Every remaining member either finished or must re-rendezvous without the
  // departed node.
  bool any_running =
      std::any_of(members_.begin(), members_.end(), [](const auto& kv) { return !kv.second.done; });
  if (!any_running) {
    if (members_.empty() && spares_.empty()) {
      Close(false, reason, out);
    } else if (members_.empty()) {
      // The lost node was the last running one: a hot spare takes its seat
      // (OpenNextRound promotes it and completes the round if it suffices).
      OpenNextRound(reason, /*counts_as_failure=*/false, out);
    }
    return;
  }
  // Finished members stay finished; the others re-join the next round.
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second.done ? members_.erase(it) : std::next(it);
  }
  OpenNextRound(reason, /*counts_as_failure=*/false, out);
}

void JobRendezvous::NodeLost(const std::string& node_id, std::vector<Delivery>* out) {
  if (state_ == State::kClosed) return;
  expected_.erase(node_id);
  if (spares_.erase(node_id) > 0) return;
  // While a round gathers, the seat held for a lost node (a member of the
  // previous round that had not re-joined yet, or one that had) goes to a
  // spare waiting: a node that re-joined while the seats were all held
  // waits as a spare, and would otherwise wait until the join timeout.
  auto it = members_.find(node_id);
  if (it == members_.end()) {
    if (state_ == State::kGathering) {
      PromoteSpares();
      MaybeComplete(out);
    }
    return;
  }
  if (state_ == State::kGathering) {
    members_.erase(it);
    PromoteSpares();
    MaybeComplete(out);
    return;
  }
  if (it->second.done) {  // it finished and went away: nothing to do
    return;
  }
  members_.erase(it);
  HandleDeparture(node_id, "agent " + node_id + " was lost", out);
}

std::optional<TimePoint> JobRendezvous::NodeDetached(const std::string& node_id, Duration hold,
                                                     std::vector<Delivery>* out) {
  auto it = members_.find(node_id);
  if (state_ != State::kRunning || it == members_.end() || it->second.done) {
    NodeLost(node_id, out);
    return std::nullopt;
  }
  const TimePoint by = clock_.Now() + hold;
  it->second.reattach_by = by;
  return by;
}

void JobRendezvous::Tick(std::vector<Delivery>* out) {
  const TimePoint now = clock_.Now();
  if (state_ == State::kRunning) {
    // Detached members that did not re-attach in time are lost.
    std::vector<std::string> gone;
    for (const auto& [id, m] : members_) {
      if (m.reattach_by && now >= *m.reattach_by) gone.push_back(id);
    }
    for (const auto& id : gone) {
      if (state_ == State::kRunning) NodeLost(id, out);
    }
    return;
  }
  if (state_ != State::kGathering) return;
  if (last_call_deadline_ && now >= *last_call_deadline_ &&
      static_cast<int>(members_.size()) >= shape_.min_nodes) {
    Complete(out);
    return;
  }
  for (auto it = members_.begin(); it != members_.end();) {
    if (now - it->second.joined_at >= Seconds(it->second.spec.policy.join_timeout_s)) {
      out->push_back(
          {it->first, absl::DeadlineExceededError(
                          Prefix() + "rendezvous timed out after " +
                          std::to_string(static_cast<int>(it->second.spec.policy.join_timeout_s)) +
                          " s with " + std::to_string(members_.size()) + " of " +
                          std::to_string(shape_.min_nodes) +
                          " required nodes; start the other nodes, or lower --nnodes")});
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  // Too few left for the last call: it is re-armed when enough are back (a
  // deadline that Tick() cannot apply must not stay pending).
  if (static_cast<int>(members_.size()) < shape_.min_nodes) last_call_deadline_.reset();
  if (members_.empty() && expected_.empty() && round_ > 0 && spares_.empty()) {
    Close(false, "every node left before the round completed", out);
  }
}

void JobRendezvous::NoteDeadline(TimePoint t) {
  if (!new_deadline_ || t < *new_deadline_) new_deadline_ = t;
}

std::optional<TimePoint> JobRendezvous::TakeNewDeadline() {
  // Every noted deadline belongs to a gathering round (a join timeout, the
  // last call): one that the same change completed (a one-node round, the
  // last joiner) or closed is gone already.
  std::optional<TimePoint> t = std::exchange(new_deadline_, std::nullopt);
  return state_ == State::kGathering ? t : std::nullopt;
}

std::optional<TimePoint> JobRendezvous::NextDeadline() const {
  if (state_ == State::kRunning) {
    std::optional<TimePoint> next;
    for (const auto& [id, m] : members_) {
      if (m.reattach_by && (!next || *m.reattach_by < *next)) next = m.reattach_by;
    }
    return next;
  }
  if (state_ != State::kGathering) return std::nullopt;
  std::optional<TimePoint> next = last_call_deadline_;
  for (const auto& [id, m] : members_) {
    TimePoint t = m.joined_at + Seconds(m.spec.policy.join_timeout_s);
    if (!next || t < *next) next = t;
  }
  return next;
}

JobStatus JobRendezvous::Status() const {
  JobStatus s;
  s.job_id = job_id_;
  s.round = round_;
  switch (state_) {
    case State::kGathering:
      s.state = "gathering";
      break;
    case State::kRunning:
      s.state = "running";
      break;
    case State::kClosed:
      s.state = close_success_ ? "succeeded" : "failed";
      break;
  }
  s.restart_count = restart_count_;
  if (state_ == State::kRunning) {
    s.nodes = assigned_;
    for (const auto& n : assigned_) s.world_size += n.nproc;
  } else {
    for (const auto& [id, m] : members_)
      s.nodes.push_back(NodeInfo{-1, m.spec.host, m.spec.pid, m.spec.nproc, -1});
  }
  s.waiting = static_cast<int>(spares_.size());
  const TimePoint now = clock_.Now();
  if (shaped_) {
    s.min_nodes = shape_.min_nodes;
    s.max_nodes = shape_.max_nodes;
  }
  if (state_ == State::kGathering && !members_.empty()) {
    TimePoint first = TimePoint::max();
    for (const auto& [id, m] : members_)
      first = std::min(first, m.joined_at + Seconds(m.spec.policy.join_timeout_s));
    s.join_deadline_in_s = std::max(0.0, std::chrono::duration<double>(first - now).count());
  }
  for (const auto& [host, until] : quarantined_until_) {
    if (until <= now) continue;
    s.quarantined.push_back(
        host + ": " + std::to_string(host_failures_.at(host)) + " worker failures, " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(until - now).count() + 1) +
        " s left");
  }
  return s;
}

JobSnapshot JobRendezvous::Snapshot() const {
  JobSnapshot s;
  s.job_id = job_id_;
  s.store_token = store_token_;
  s.shaped = shaped_;
  s.shape = shape_;
  s.state = state_ == State::kRunning  ? "running"
            : state_ == State::kClosed ? "closed"
                                       : "gathering";
  s.round = round_;
  s.restart_count = restart_count_;
  if (state_ == State::kRunning) {
    for (const auto& [id, m] : members_) s.members.push_back({id, m.spec, m.done});
    s.assigned = assigned_;
    s.assigned_ids = assigned_ids_;
  } else {
    // A gathering round is re-formed by re-joins; remember who to wait for.
    for (const auto& [id, m] : members_) s.expected.push_back(id);
  }
  for (const auto& id : expected_) s.expected.push_back(id);
  s.failures = failures_;
  s.close_reason = close_reason_;
  s.close_success = close_success_;
  return s;
}

std::unique_ptr<JobRendezvous> JobRendezvous::Restore(const JobSnapshot& snap, const Clock& clock,
                                                      Duration reattach_timeout) {
  auto job = std::make_unique<JobRendezvous>(snap.job_id, clock);
  job->store_token_ = snap.store_token;
  job->shaped_ = snap.shaped;
  job->shape_ = snap.shape;
  job->round_ = snap.round;
  job->restart_count_ = snap.restart_count;
  job->failures_ = snap.failures;
  job->close_reason_ = snap.close_reason;
  job->close_success_ = snap.close_success;
  job->version_ = 1;
  const TimePoint now = clock.Now();
  if (snap.state == "closed") {
    job->state_ = State::kClosed;
  } else if (snap.state == "running" && !snap.assigned.empty() &&
             snap.assigned.size() == snap.assigned_ids.size()) {
    job->state_ = State::kRunning;
    for (const auto& m : snap.members) {
      Member member{m.spec, now, m.done, std::nullopt};
      if (!m.done) member.reattach_by = now + reattach_timeout;
      if (m.spec.requested_rank >= 0) job->rank_holders_[m.spec.requested_rank] = m.node_id;
      job->members_.emplace(m.node_id, std::move(member));
    }
    job->assigned_ = snap.assigned;
    job->assigned_ids_ = snap.assigned_ids;
    auto master = job->members_.find(snap.assigned_ids[0]);
    job->master_addr_ = snap.assigned[0].host;
    job->master_port_ = master != job->members_.end() ? master->second.spec.master_port : 0;
  } else {
    job->state_ = State::kGathering;
    // Seats are held for the members of a finished round; round 0 has none
    // (its agents join again, in any order, like the first time).
    if (snap.round > 0) job->expected_.insert(snap.expected.begin(), snap.expected.end());
  }
  return job;
}

}  // namespace ddprun::rendezvous
