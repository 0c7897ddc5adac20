// The daemon's jobs: for each job id one JobRendezvous (the round state
// machine), one KvEngine (the running round's store) and the event sinks of
// its agents' Join streams; the limits that protect the server from
// strangers; persistence through a JobJournal. No gRPC and no threads: the
// Rendezvous and Store services (rendezvous_services.cc) call it, and a DeadlineTimer
// calls Tick() when NextDeadline() passes.
//
// Thread-safe. Every method takes the table's lock; events go to the sinks
// after it is released, and after the change is durable in the journal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/job_journal.h"
#include "ddprun/rendezvous/job_observer.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {

// Bounds on what a stranger may ask for.
inline constexpr int kMaxNproc = 65536;
inline constexpr int kMaxNodes = 1 << 20;
inline constexpr std::size_t kMaxHostBytes = 1024;
inline constexpr Duration kMaxTimeout = std::chrono::hours(7 * 24);
inline constexpr std::size_t kDefaultMaxJobs = 100000;
// How long a closed job stays visible to Status before it is forgotten.
inline constexpr Duration kDefaultClosedJobRetention = std::chrono::minutes(10);
inline constexpr Duration kDefaultReattachTimeout = std::chrono::seconds(10);

// One agent's Join stream, as the table sees it.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Called once, under the table's lock, before the sink is registered as
  // node_id's stream of job_id. From then on the sink's owner tells the table
  // when the stream ends (StreamLost or Unregister with this sink). Must not
  // call into the table.
  virtual void Bind(const std::string& job_id, const std::string& node_id) = 0;
  // One event for the agent, in order. Called without the table's lock. A
  // terminal event (anything but an Assignment) is the last one: the table
  // forgets the sink when it sends one.
  virtual void Deliver(RoundEvent event) = 0;
};

struct JobTableOptions {
  const Clock* clock = &SystemClock::Get();
  QuarantinePolicy quarantine;
  // How long a restored member, or one whose stream broke while the server
  // was stalled, has to re-attach before it counts as lost.
  Duration reattach_timeout = kDefaultReattachTimeout;
  std::size_t max_jobs = kDefaultMaxJobs;
  // Duration::max(): closed jobs are kept as long as the table (ddprun's
  // in-process table of a one-node job, which lives as long as the job).
  Duration closed_job_retention = kDefaultClosedJobRetention;
  // Where jobs are kept across a restart; null keeps them in memory only.
  // Not owned; must outlive the table.
  JobJournal* journal = nullptr;
  // Called without the table's lock after a change that may have brought a
  // deadline (a round's, a store wait's, a closed job's retention) earlier
  // than NextDeadline() was before: the timer waits for it. May be empty.
  std::function<void(TimePoint)> on_deadline;
  // Told about every round, join, loss, restart and end of a job, under the
  // table's lock (the metrics hub). Not owned; may be null.
  JobObserver* observer = nullptr;
};

class JobTable {
 public:
  explicit JobTable(JobTableOptions options);
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;
  ~JobTable();

  // Brings back the journal's jobs; call once, before serving. Running
  // rounds come back with their members detached (see JobRendezvous::Restore).
  absl::Status Recover();

  // Validates spec (job id rule, limits), creates the job on its first join
  // (ResourceExhausted beyond max_jobs) and registers sink as the joining
  // node's stream. Returns the node id; events (possibly this node's own
  // assignment) go to the sinks. A refused first join leaves no job behind.
  absl::StatusOr<std::string> Join(const JoinSpec& spec, std::shared_ptr<EventSink> sink);
  // The server's own verdict on a running round (metrics_hub.h: a hang with
  // --on_hang=abort): the job closes failed with reason and failures.
  // NotFound for an unknown job, FailedPrecondition for another round.
  absl::Status Abort(const std::string& job_id, std::int64_t round, const std::string& reason,
                     std::vector<WorkerFailure> failures);
  // An agent reports how its round ended. NotFound for an unknown job.
  // `cause`: what failed, when the server itself fails a node (a hang with
  // --on_hang=restart); see JobRendezvous::Report.
  absl::Status Report(const std::string& job_id, const std::string& node_id, std::int64_t round,
                      Outcome outcome, std::vector<WorkerFailure> failures,
                      const std::string& cause = "");
  // The node's stream broke without a terminal event: the node is lost, or,
  // with a `hold` (the server was stalled, so the agent may have dropped the
  // stream because of it), a running member keeps its seat for that long to
  // re-attach with a resumed Join (JobRendezvous::NodeDetached).
  // Ignored unless sink is the node's current stream (a stale stream).
  void StreamLost(const std::string& job_id, const std::string& node_id, const EventSink* sink,
                  Duration hold = Duration::zero());
  // The node's stream ended after its terminal event: forget the sink.
  void Unregister(const std::string& job_id, const std::string& node_id, const EventSink* sink);
  // A snapshot of one job (job_id) or of every job (""), in job id order.
  std::vector<JobStatus> Status(std::string_view job_id = "") const;
  std::size_t NumJobs() const;

  // The store of scope's round, after checking the job id, the token and the
  // round: Unauthenticated without a token, PermissionDenied for a wrong
  // token or an unknown job (the same answer), FailedPrecondition for a
  // stale round.
  absl::StatusOr<std::shared_ptr<KvEngine>> StoreFor(const StoreScope& scope);
  // Whether a store write of value_bytes at key could be made durable:
  // checked before the store takes the value (OK in memory; the etcd
  // journal's limit otherwise, InvalidArgument naming it and the fix).
  absl::Status CheckStoreValue(const StoreScope& scope, const std::string& key,
                               std::size_t value_bytes) const;
  // Makes a store write durable before it is acknowledged (no-op in memory).
  absl::Status PersistKey(const StoreScope& scope, const std::string& key, const KvEngine& engine);
  // engine.WaitAsync(keys, deadline, cb), and the timer learns the deadline.
  void WaitAsync(KvEngine& engine, std::vector<std::string> keys, TimePoint deadline,
                 KvEngine::WaitCallback cb);

  // The earliest pending deadline of any job, store wait or closed job's
  // retention; nullopt when nothing waits. Never a deadline that Tick()
  // cannot clear.
  std::optional<TimePoint> NextDeadline() const;
  // Applies every deadline that passed: rounds' timeouts, store waits that
  // time out, closed jobs past their retention (forgotten, with no stream left).
  void Tick();

  // Stops every change (a later call gets Unavailable), ends every open
  // stream with Unavailable and cancels store waits. Jobs stay as they are in
  // the journal, so a restarted server finds them. Idempotent.
  void Shutdown();

 private:
  struct Job {
    std::unique_ptr<JobRendezvous> rdzv;
    std::shared_ptr<KvEngine> store;
    std::int64_t store_round = 0;
    std::map<std::string, std::shared_ptr<EventSink>> sinks;
    std::optional<TimePoint> closed_at;
    std::uint64_t persisted_version = 0;
    // A change of the job could not be persisted: its agents were told so
    // and their streams ended; Tick() drops the job from memory (etcd keeps
    // its last durable version), so that a later run starts afresh.
    bool undurable = false;
  };
  using Batch = std::vector<std::pair<std::shared_ptr<EventSink>, RoundEvent>>;
  // A job's state and round before a change, to tell what the change did.
  struct Before {
    JobRendezvous::State state;
    std::int64_t round;
  };

  using JobMap = std::map<std::string, Job, std::less<>>;

  // Removes the job at `it` from memory: the observer hears it forgotten,
  // its store's waiters fail with `waiters`, and with `forget` the journal
  // forgets it too. Returns the next job.
  // A job in its first round, gathering, with no node waiting and no stream:
  // its only nodes left before it ever ran.
  bool NeverRanAndEmptyLocked(const Job& job) const;
  JobMap::iterator DropLocked(JobMap::iterator it, const char* why, bool forget,
                              const absl::Status& waiters);
  // The job `job_id` (nullptr never): NotFound fenced by `round` when there
  // is none, Unavailable once the table is closing.
  absl::StatusOr<Job*> FindLocked(const std::string& job_id, std::int64_t round);
  // Settles one change of `job` whose deliveries are `out`: logs it on the
  // debug channel, tells the observer (tag/text: an event for the timeline,
  // "" for none), then moves the deliveries into `batch` (CollectLocked).
  void SettleLocked(Job& job, Before before, std::vector<Delivery>& out, const std::string& tag,
                    const std::string& text, Batch* batch);
  // Turns deliveries into (sink, event) pairs (terminal events unregister
  // the sink), notes closing, rotates the store, persists, and logs. A
  // change whose persist fails is not delivered: its members get the error.
  void CollectLocked(Job& job, std::vector<Delivery>& out, Batch* batch);
  // Tells the observer what a change did (before CollectLocked moves the
  // events); tag/text as for SettleLocked.
  void ObserveLocked(const JobRendezvous& r, Before before, const std::vector<Delivery>& out,
                     const std::string& tag, const std::string& text);
  void RotateStoreLocked(Job& job);
  absl::Status PersistLocked(Job& job);
  // The job's own earliest deadline (nullopt: none that Tick() can clear).
  // O(members): for the timer's wake-ups only.
  std::optional<TimePoint> DeadlineOfLocked(const Job& job) const;
  // When a closed job with no stream left is forgotten; nullopt while it is
  // open or streamed, and always with a retention of Duration::max().
  std::optional<TimePoint> RetentionEndLocked(const Job& job) const;
  // What the last change of the job added (O(1)): its new round deadlines
  // and, once a closed job has no stream left, its retention.
  std::optional<TimePoint> NewDeadlineLocked(Job& job);
  // Sends the batch and tells the timer about deadline; without the lock.
  void Finish(Batch& batch, std::optional<TimePoint> deadline);

  const JobTableOptions options_;
  const Clock& clock_;
  mutable std::mutex mu_;
  bool closing_ = false;
  JobMap jobs_;
};

}  // namespace ddprun::rendezvous
