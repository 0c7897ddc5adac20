#include "ddprun/rendezvous/job_table.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_id.h"

namespace ddprun::rendezvous {
namespace {

const char* StateName(JobRendezvous::State s) {
  switch (s) {
    case JobRendezvous::State::kGathering:
      return "gathering";
    case JobRendezvous::State::kRunning:
      return "running";
    case JobRendezvous::State::kClosed:
      return "closed";
  }
  return "?";
}

// The fence of a message about a job id that may be invalid: a stranger's
// id is echoed only when it is short printable ASCII (ValidateJobId's own
// message shows the rest safely).
std::string SafeFence(std::string_view job_id) {
  const bool printable =
      !job_id.empty() && job_id.size() <= kMaxJobIdBytes &&
      std::all_of(job_id.begin(), job_id.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  return printable ? Fence(job_id, -1) : "";
}

absl::Status CheckJobId(std::string_view job_id) {
  absl::Status st = ValidateJobId(job_id);
  if (st.ok()) return st;
  return absl::InvalidArgumentError(SafeFence(job_id) + std::string(st.message()));
}

// A timeout from the wire (seconds): finite, within kMaxTimeout, and > 0
// unless zero is allowed.
bool TimeoutInRange(double seconds, bool allow_zero) {
  const double max = std::chrono::duration<double>(kMaxTimeout).count();
  return (allow_zero ? seconds >= 0 : seconds > 0) && seconds <= max;
}

absl::Status ValidateJoin(const JoinSpec& s) {
  DDPRUN_RETURN_IF_ERROR(CheckJobId(s.job_id));
  auto fence = [&] { return Fence(s.job_id, -1); };  // only for an error
  if (s.host.empty() || s.host.size() > kMaxHostBytes)
    return absl::InvalidArgumentError(fence() + "join without a host address");
  if (s.nproc < 1 || s.nproc > kMaxNproc)
    return absl::InvalidArgumentError(fence() + "nproc " + std::to_string(s.nproc) +
                                      " is out of range 1.." + std::to_string(kMaxNproc));
  if (s.min_nodes < 1 || s.max_nodes < s.min_nodes || s.max_nodes > kMaxNodes)
    return absl::InvalidArgumentError(fence() + "bad node counts " + std::to_string(s.min_nodes) +
                                      ":" + std::to_string(s.max_nodes) + "; need 0 < MIN <= MAX");
  if (!TimeoutInRange(s.policy.join_timeout_s, false) ||
      !TimeoutInRange(s.policy.last_call_timeout_s, true))
    return absl::InvalidArgumentError(fence() + "join or last-call timeout out of range");
  if (s.policy.max_restarts < 0 || s.requested_rank < -1 || s.master_port < 0 ||
      s.master_port > kMaxPort)
    return absl::InvalidArgumentError(fence() + "malformed join request");
  return absl::OkStatus();
}

absl::Status ShuttingDown() {
  return absl::UnavailableError("the rendezvous server is shutting down");
}

std::optional<TimePoint> Earlier(std::optional<TimePoint> a, std::optional<TimePoint> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// What a change did to a job (state and round before it), for the debug channel.
void LogChange(const JobRendezvous& r, JobRendezvous::State before_state, std::int64_t before_round,
               const std::vector<Delivery>& out) {
  if (!(debug::Enabled() & debug::kRdzv)) return;
  const std::string fence = Fence(r.job_id(), r.round());
  for (const auto& d : out) {
    if (const auto* c = std::get_if<JobClosed>(&d.event)) {
      DDPRUN_DEBUG_LOG(kRdzv) << fence << "closed: " << (c->success ? "success" : "failure") << " ("
                              << c->reason << ")";
      return;
    }
    if (const auto* x = std::get_if<RestartRound>(&d.event)) {
      DDPRUN_DEBUG_LOG(kRdzv) << fence << "restart: round " << before_round << " -> "
                              << x->next_round << (x->counts_as_failure ? ", a failure" : "")
                              << (x->reason.empty() ? "" : ": ") << x->reason;
      return;
    }
  }
  if (r.state() == JobRendezvous::State::kRunning &&
      (before_state != JobRendezvous::State::kRunning || before_round != r.round())) {
    const JobStatus s = r.Status();
    DDPRUN_DEBUG_LOG(kRdzv) << fence << "round complete: " << s.nodes.size()
                            << " nodes, world size " << s.world_size;
  } else if (r.state() == JobRendezvous::State::kClosed &&
             before_state != JobRendezvous::State::kClosed) {
    DDPRUN_DEBUG_LOG(kRdzv) << fence << "closed";
  }
}

}  // namespace

JobTable::JobTable(JobTableOptions options)
    : options_(std::move(options)), clock_(*options_.clock) {}

JobTable::~JobTable() = default;

absl::Status JobTable::Recover() {
  if (!options_.journal) return absl::OkStatus();
  DDPRUN_ASSIGN_OR_RETURN(std::vector<RecoveredJob> recovered, options_.journal->Recover());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : recovered) {
    for (const auto& w : r.warnings) std::fprintf(stderr, "ddprund: warning: %s\n", w.c_str());
    Job job;
    job.rdzv = JobRendezvous::Restore(r.snapshot, clock_, options_.reattach_timeout);
    job.store = std::make_shared<KvEngine>();
    job.store_round = r.store_round;
    for (auto& [k, v] : r.store) (void)job.store->Set(k, std::move(v));
    job.persisted_version = job.rdzv->version();
    if (job.rdzv->state() == JobRendezvous::State::kClosed) job.closed_at = clock_.Now();
    DDPRUN_DEBUG_LOG(kRdzv) << Fence(r.snapshot.job_id, job.rdzv->round()) << "recovered, "
                            << StateName(job.rdzv->state());
    ObserveLocked(*job.rdzv, {JobRendezvous::State::kGathering, -1}, {}, "", "");
    jobs_.insert_or_assign(r.snapshot.job_id, std::move(job));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobTable::Join(const JoinSpec& spec, std::shared_ptr<EventSink> sink) {
  DDPRUN_RETURN_IF_ERROR(ValidateJoin(spec));
  Batch batch;
  std::optional<TimePoint> deadline;
  absl::StatusOr<std::string> id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return ShuttingDown();
    auto it = jobs_.find(spec.job_id);
    const bool created = it == jobs_.end();
    if (created) {
      if (jobs_.size() >= options_.max_jobs) {
        return absl::ResourceExhaustedError(
            Fence(spec.job_id, -1) + "the rendezvous server holds too many jobs (" +
            std::to_string(options_.max_jobs) + "); retry once older jobs have ended");
      }
      Job job;
      job.rdzv = std::make_unique<JobRendezvous>(spec.job_id, clock_, options_.quarantine);
      it = jobs_.emplace(spec.job_id, std::move(job)).first;
      DDPRUN_DEBUG_LOG(kRdzv) << Fence(spec.job_id, 0) << "new job";
    }
    Job& job = it->second;
    const Before before{job.rdzv->state(), job.rdzv->round()};
    std::vector<Delivery> out;
    id = job.rdzv->Join(spec, &out);
    if (!id.ok()) {
      DDPRUN_DEBUG_LOG(kRdzv) << "join of " << spec.host << " pid " << spec.pid
                              << " refused: " << id.status().message();
      if (created) {
        jobs_.erase(it);  // a refused first join leaves no empty job behind
        return id;
      }
      // A refused join can still change the job (a quarantined node that
      // the others were waiting for completes their round): tell them.
    } else {
      DDPRUN_DEBUG_LOG(kRdzv) << Fence(spec.job_id, job.rdzv->round()) << "join: node " << *id
                              << (spec.resume_round >= 0 ? " (resumed)" : "") << ", "
                              << StateName(job.rdzv->state());
      if (spec.resume_round < 0) {
        // The first joiner fixed the policy; the joining node is told too
        // (its Assignment carries the job's policy).
        const std::string warning =
            PolicyWarning("node " + *id, spec.policy, job.rdzv->shape().policy);
        if (!warning.empty()) {
          std::fprintf(stderr, "%swarning: %s\n", Fence(spec.job_id, job.rdzv->round()).c_str(),
                       warning.c_str());
        }
      }
      sink->Bind(spec.job_id, *id);
      // Registered before delivering, so an assignment completed by this very
      // join reaches its own stream.
      job.sinks[*id] = std::move(sink);
    }
    SettleLocked(job, before, out, id.ok() ? "join" : "",
                 id.ok() ? spec.host + " joined as node " + *id : "", &batch);
    deadline = NewDeadlineLocked(job);
  }
  Finish(batch, deadline);
  return id;
}

absl::Status JobTable::Report(const std::string& job_id, const std::string& node_id,
                              std::int64_t round, Outcome outcome,
                              std::vector<WorkerFailure> failures, const std::string& cause) {
  DDPRUN_RETURN_IF_ERROR(CheckJobId(job_id));
  Batch batch;
  std::optional<TimePoint> deadline;
  absl::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DDPRUN_ASSIGN_OR_RETURN(Job* const found, FindLocked(job_id, round));
    Job& job = *found;
    const Before before{job.rdzv->state(), job.rdzv->round()};
    DDPRUN_DEBUG_LOG(kRdzv) << Fence(job_id, round) << "report from " << node_id << ": "
                            << (outcome == Outcome::kSucceeded ? "succeeded"
                                : outcome == Outcome::kFailed  ? "failed"
                                                               : "leaving");
    std::vector<Delivery> out;
    std::string what;
    if (outcome == Outcome::kFailed && !cause.empty()) {
      what = cause + "; node " + node_id + " fails";
    } else if (outcome == Outcome::kFailed) {
      what = "node " + node_id + " reported a worker failure";
      if (!failures.empty() && failures.front().global_rank >= 0)
        what += " (rank " + std::to_string(failures.front().global_rank) + ")";
    } else if (outcome == Outcome::kLeaving) {
      what = "node " + node_id + " left";
    }
    const char* tag = outcome == Outcome::kFailed ? "failure" : "leave";
    st = job.rdzv->Report(node_id, round, outcome, std::move(failures), &out, cause);
    SettleLocked(job, before, out, st.ok() && !what.empty() ? tag : "", st.ok() ? what : "",
                 &batch);
    deadline = NewDeadlineLocked(job);
  }
  Finish(batch, deadline);
  return st;
}

void JobTable::StreamLost(const std::string& job_id, const std::string& node_id,
                          const EventSink* sink, Duration hold) {
  Batch batch;
  std::optional<TimePoint> deadline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    auto s = job.sinks.find(node_id);
    if (s == job.sinks.end() || s->second.get() != sink) return;  // a stale stream
    job.sinks.erase(s);
    const Before before{job.rdzv->state(), job.rdzv->round()};
    std::vector<Delivery> out;
    std::optional<TimePoint> held;
    if (hold > Duration::zero()) {
      held = job.rdzv->NodeDetached(node_id, hold, &out);
    } else {
      job.rdzv->NodeLost(node_id, &out);
    }
    if (held) {
      const std::string what = absl::StrCat(
          "node ", node_id, "'s stream broke while this server was stalled; its seat is held ",
          std::chrono::duration<double>(hold).count(), " s for it to re-attach");
      DDPRUN_DEBUG_LOG(kRdzv) << Fence(job_id, job.rdzv->round()) << what;
      SettleLocked(job, before, out, "detached", what, &batch);
    } else {
      DDPRUN_DEBUG_LOG(kRdzv) << Fence(job_id, job.rdzv->round()) << "lost node " << node_id;
      SettleLocked(job, before, out, "lost", "node " + node_id + " lost (its stream broke)",
                   &batch);
    }
    if (NeverRanAndEmptyLocked(job)) {
      // Its only node left before the job ever ran: nothing to keep, so it is
      // not listed until its join timeout (issue 33 item 8); an agent that
      // re-joins starts it afresh.
      DropLocked(it, "forgotten: its last node left before the first round ran", /*forget=*/true,
                 ClosedError(Fence(job_id, 0) + "the job's last node left before it ran"));
    } else {
      deadline = NewDeadlineLocked(job);
      if (held && (!deadline || *held < *deadline)) deadline = held;
    }
  }
  Finish(batch, deadline);
}

bool JobTable::NeverRanAndEmptyLocked(const Job& job) const {
  if (!job.sinks.empty() || job.rdzv->state() != JobRendezvous::State::kGathering ||
      job.rdzv->round() != 0) {
    return false;
  }
  const JobStatus st = job.rdzv->Status();
  return st.restart_count == 0 && st.waiting == 0 && st.nodes.empty();
}

void JobTable::Unregister(const std::string& job_id, const std::string& node_id,
                          const EventSink* sink) {
  std::optional<TimePoint> deadline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    auto s = it->second.sinks.find(node_id);
    if (s == it->second.sinks.end() || s->second.get() != sink) return;
    it->second.sinks.erase(s);
    // The last stream of a closed job gone: its retention may count now.
    deadline = NewDeadlineLocked(it->second);
  }
  Batch none;
  Finish(none, deadline);
}

std::vector<JobStatus> JobTable::Status(std::string_view job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobStatus> result;
  if (!job_id.empty()) {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) result.push_back(it->second.rdzv->Status());
    return result;
  }
  result.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) result.push_back(job.rdzv->Status());
  return result;
}

std::size_t JobTable::NumJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

absl::StatusOr<std::shared_ptr<KvEngine>> JobTable::StoreFor(const StoreScope& scope) {
  DDPRUN_RETURN_IF_ERROR(CheckJobId(scope.job_id));
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return ShuttingDown();
  // The same answer for an unknown job and a wrong token: a stranger learns nothing.
  if (scope.token.empty())
    return absl::UnauthenticatedError(Fence(scope.job_id, scope.round) +
                                      "store request without a token; run the worker under "
                                      "ddprun, which sets DDPRUN_TOKEN");
  auto it = jobs_.find(scope.job_id);
  if (it == jobs_.end() || it->second.rdzv->store_token() != scope.token)
    return absl::PermissionDeniedError(Fence(scope.job_id, scope.round) +
                                       "the store token does not match this job; use the "
                                       "DDPRUN_TOKEN that ddprun gave this job's workers");
  Job& job = it->second;
  if (scope.round != job.rdzv->round())
    return absl::FailedPreconditionError(
        Fence(scope.job_id, scope.round) + "stale round: the job is in round " +
        std::to_string(job.rdzv->round()) + "; a worker of an old round must exit");
  RotateStoreLocked(job);
  return job.store;
}

absl::Status JobTable::CheckStoreValue(const StoreScope& scope, const std::string& key,
                                       std::size_t value_bytes) const {
  if (!options_.journal) return absl::OkStatus();
  return options_.journal->CheckStoreValue(scope.job_id, scope.round, key, value_bytes);
}

absl::Status JobTable::PersistKey(const StoreScope& scope, const std::string& key,
                                  const KvEngine& engine) {
  if (!options_.journal) return absl::OkStatus();
  return options_.journal->AppendKey(scope.job_id, scope.round, key, engine);
}

void JobTable::WaitAsync(KvEngine& engine, std::vector<std::string> keys, TimePoint deadline,
                         KvEngine::WaitCallback cb) {
  // A wait satisfied at once calls cb here; the timer then wakes for nothing.
  engine.WaitAsync(std::move(keys), deadline, std::move(cb));
  if (options_.on_deadline) options_.on_deadline(deadline);
}

std::optional<TimePoint> JobTable::NewDeadlineLocked(Job& job) {
  std::optional<TimePoint> next = job.rdzv->TakeNewDeadline();
  if (job.undurable) next = Earlier(next, clock_.Now());  // Tick() drops it
  next = Earlier(next, RetentionEndLocked(job));
  return next;
}

std::optional<TimePoint> JobTable::RetentionEndLocked(const Job& job) const {
  if (!job.closed_at || !job.sinks.empty() || options_.closed_job_retention == Duration::max()) {
    return std::nullopt;
  }
  return *job.closed_at + options_.closed_job_retention;
}

std::optional<TimePoint> JobTable::DeadlineOfLocked(const Job& job) const {
  std::optional<TimePoint> next = job.rdzv->NextDeadline();
  if (job.undurable && job.sinks.empty()) next = Earlier(next, clock_.Now());
  if (job.store) next = Earlier(next, job.store->NextDeadline());
  // A closed job is forgotten only once no stream is left, so its retention
  // is a deadline only then (a deadline Tick() cannot clear would spin the timer).
  next = Earlier(next, RetentionEndLocked(job));
  return next;
}

std::optional<TimePoint> JobTable::NextDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return std::nullopt;
  std::optional<TimePoint> next;
  for (const auto& [id, job] : jobs_) next = Earlier(next, DeadlineOfLocked(job));
  return next;
}

void JobTable::Tick() {
  Batch batch;
  std::vector<std::shared_ptr<KvEngine>> engines;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    const TimePoint now = clock_.Now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = it->second;
      if (job.undurable && job.sinks.empty()) {
        // Dropped from memory only: etcd keeps the last version it holds.
        it = DropLocked(it, "dropped: a change could not be persisted", /*forget=*/false,
                        absl::UnavailableError(Fence(it->first, job.store_round) +
                                               "the job could not be persisted; it is over"));
        continue;
      }
      if (const auto end = RetentionEndLocked(job); end && now >= *end) {
        it = DropLocked(
            it, "forgotten", /*forget=*/true,
            ClosedError(Fence(it->first, job.store_round) + "the job is over and forgotten"));
        continue;
      }
      auto next = job.rdzv->NextDeadline();
      if (next && *next <= now) {
        const Before before{job.rdzv->state(), job.rdzv->round()};
        std::vector<Delivery> out;
        job.rdzv->Tick(&out);
        SettleLocked(job, before, out, "", "", &batch);
        (void)job.rdzv->TakeNewDeadline();  // the timer asks NextDeadline() after Tick()
      }
      if (job.store && job.store->NumWaiters() > 0) engines.push_back(job.store);
      ++it;
    }
  }
  Finish(batch, std::nullopt);
  // Outside the lock: the waiters' callbacks answer their calls.
  const TimePoint now = clock_.Now();
  for (auto& e : engines) e->ExpireWaiters(now);
}

void JobTable::Shutdown() {
  Batch batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    // From now on nothing changes a job: streams that end because we stop
    // are not lost agents, and a restarted server must find the jobs as they
    // were (the journal).
    closing_ = true;
    for (auto& [id, job] : jobs_) {
      for (auto& [node, sink] : job.sinks)
        batch.emplace_back(sink, absl::UnavailableError(Fence(id, job.rdzv->round()) +
                                                        "the rendezvous server is shutting down"));
      job.sinks.clear();
      if (job.store) job.store->CancelAll(absl::UnavailableError("the server is shutting down"));
    }
  }
  Finish(batch, std::nullopt);
}

absl::Status JobTable::Abort(const std::string& job_id, std::int64_t round,
                             const std::string& reason, std::vector<WorkerFailure> failures) {
  Batch batch;
  std::optional<TimePoint> deadline;
  absl::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DDPRUN_ASSIGN_OR_RETURN(Job* const found, FindLocked(job_id, round));
    Job& job = *found;
    const Before before{job.rdzv->state(), job.rdzv->round()};
    std::vector<Delivery> out;
    st = job.rdzv->Abort(round, reason, std::move(failures), &out);
    SettleLocked(job, before, out, "", "", &batch);
    deadline = NewDeadlineLocked(job);
  }
  Finish(batch, deadline);
  return st;
}

JobTable::JobMap::iterator JobTable::DropLocked(JobMap::iterator it, const char* why, bool forget,
                                                const absl::Status& waiters) {
  DDPRUN_DEBUG_LOG(kRdzv) << Fence(it->first, it->second.rdzv->round()) << why;
  if (options_.observer) {
    JobChange c;
    c.kind = JobChange::Kind::kForgotten;
    c.job_id = it->first;
    options_.observer->OnJobChange(c);
  }
  if (forget && options_.journal) options_.journal->Forget(it->first);
  if (it->second.store) it->second.store->CancelAll(waiters);
  return jobs_.erase(it);
}

absl::StatusOr<JobTable::Job*> JobTable::FindLocked(const std::string& job_id, std::int64_t round) {
  if (closing_) return ShuttingDown();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end())
    return absl::NotFoundError(Fence(job_id, round) + "no such job on this server");
  return &it->second;
}

void JobTable::SettleLocked(Job& job, Before before, std::vector<Delivery>& out,
                            const std::string& tag, const std::string& text, Batch* batch) {
  LogChange(*job.rdzv, before.state, before.round, out);  // before CollectLocked moves them
  ObserveLocked(*job.rdzv, before, out, tag, text);
  CollectLocked(job, out, batch);
}

void JobTable::ObserveLocked(const JobRendezvous& r, Before before,
                             const std::vector<Delivery>& out, const std::string& tag,
                             const std::string& text) {
  const JobRendezvous::State before_state = before.state;
  const std::int64_t before_round = before.round;
  JobObserver* obs = options_.observer;
  if (!obs) return;
  auto change = [&](JobChange::Kind kind) {
    JobChange c;
    c.kind = kind;
    c.job_id = r.job_id();
    c.round = r.round();
    return c;
  };
  if (!text.empty()) {
    JobChange c = change(JobChange::Kind::kEvent);
    c.tag = tag;
    c.text = text;
    obs->OnJobChange(c);
  }
  for (const auto& d : out) {
    if (const auto* x = std::get_if<RestartRound>(&d.event)) {
      JobChange c = change(JobChange::Kind::kRestart);
      c.round = before_round;
      c.text = x->reason;
      c.counts_as_failure = x->counts_as_failure;
      obs->OnJobChange(c);
      break;
    }
  }
  if (r.state() == JobRendezvous::State::kClosed) {
    if (before_state == JobRendezvous::State::kClosed) return;
    const JobSnapshot snap = r.Snapshot();
    JobChange c = change(JobChange::Kind::kClosed);
    c.success = snap.close_success;
    c.text = snap.close_reason;
    c.failures = snap.failures;
    obs->OnJobChange(c);
    return;
  }
  if (r.state() == JobRendezvous::State::kRunning &&
      (before_state != JobRendezvous::State::kRunning || before_round != r.round())) {
    JobChange c = change(JobChange::Kind::kRoundStarted);
    c.nodes = r.assigned();
    c.node_ids = r.assigned_ids();
    c.world_size = c.nodes.empty() ? 0 : c.nodes.back().base_rank + c.nodes.back().nproc;
    c.restart_count = r.Status().restart_count;
    c.policy = r.shape().policy;
    obs->OnJobChange(c);
  }
}

void JobTable::CollectLocked(Job& job, std::vector<Delivery>& out, Batch* batch) {
  const std::size_t heard_before = batch->size();
  for (auto& d : out) {
    auto it = job.sinks.find(d.node_id);
    if (it == job.sinks.end()) continue;  // that agent is gone; nothing to tell
    const bool terminal = !std::holds_alternative<Assignment>(d.event);
    batch->emplace_back(it->second, std::move(d.event));
    if (terminal) job.sinks.erase(it);
  }
  if (job.rdzv->state() == JobRendezvous::State::kClosed && !job.closed_at) {
    job.closed_at = clock_.Now();
  }
  RotateStoreLocked(job);
  // Durable before anyone hears of it: the batch is sent after this returns.
  // A change that nobody hears of while the round gathers (a join, a leave)
  // is not written: the snapshot holds every member, so writing it per join
  // made a round of N joins O(N^2) bytes, and after a restart of the server
  // the agents of a gathering round join again anyway. The round's forming,
  // which every member hears of, writes it; so does the job's first join
  // (once per job), so that a restart keeps the job and its policy while it
  // gathers and its agents re-join it.
  const bool heard = batch->size() > heard_before;
  if (!heard && job.rdzv->state() == JobRendezvous::State::kGathering &&
      job.persisted_version > 0) {
    return;
  }
  const absl::Status st = PersistLocked(job);
  if (st.ok() || !heard) return;
  // A decision that is not durable is never delivered (a replica leading
  // after a fail-over could decide differently): each member that would have
  // heard it gets the journal's error instead, and its stream ends.
  const std::string why =
      Fence(job.rdzv->job_id(), job.rdzv->round()) +
      "not delivered: the job's change could not be persisted: " + std::string(st.message());
  const absl::Status refused(st.code(), why);
  // The job cannot go on from a state etcd does not hold: every other agent
  // of it is told too, and Tick() drops it from memory.
  for (std::size_t i = heard_before; i < batch->size(); ++i) {
    auto& [sink, event] = (*batch)[i];
    event = refused;
    for (auto s = job.sinks.begin(); s != job.sinks.end(); ++s) {
      if (s->second == sink) {
        job.sinks.erase(s);
        break;
      }
    }
  }
  for (auto& [node, sink] : job.sinks) batch->emplace_back(sink, refused);
  job.sinks.clear();
  job.undurable = true;
}

void JobTable::RotateStoreLocked(Job& job) {
  // Each round gets a fresh store, so no worker ever reads a stale key (for
  // example a previous round's ncclUniqueId). Waiters of the old round fail.
  if (job.store && job.store_round == job.rdzv->round()) return;
  if (job.store) {
    job.store->CancelAll(absl::FailedPreconditionError(Fence(job.rdzv->job_id(), job.store_round) +
                                                       "the round is over; the worker must exit"));
  }
  job.store = std::make_shared<KvEngine>();
  job.store_round = job.rdzv->round();
}

absl::Status JobTable::PersistLocked(Job& job) {
  if (!options_.journal || job.persisted_version == job.rdzv->version()) return absl::OkStatus();
  absl::Status st =
      options_.journal->WriteSnapshot(job.rdzv->Snapshot(), job.store_round, *job.store);
  if (!st.ok()) {
    std::fprintf(stderr, "ddprund: %scannot persist the job (retried on its next change): %s\n",
                 Fence(job.rdzv->job_id(), job.rdzv->round()).c_str(),
                 std::string(st.message()).c_str());
    return st;
  }
  job.persisted_version = job.rdzv->version();
  return absl::OkStatus();
}

void JobTable::Finish(Batch& batch, std::optional<TimePoint> deadline) {
  for (auto& [sink, event] : batch) sink->Deliver(std::move(event));
  if (deadline && options_.on_deadline) options_.on_deadline(*deadline);
}

}  // namespace ddprun::rendezvous
