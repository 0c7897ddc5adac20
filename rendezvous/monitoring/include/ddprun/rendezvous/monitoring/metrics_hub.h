// The server side of monitoring (docs/monitoring.md): every job's live
// per-rank metrics, its time series and timeline, stragglers, and hang
// detection. No gRPC, no sockets, no threads: rendezvous_services.cc feeds it the agents'
// MetricsReports, the JobTable tells it about rounds (JobObserver), a
// one-second ticker calls Tick(), and the dashboard, /metrics and GetMetrics
// read View(). The clock is injected, so unit tests run it in simulated time.
//
// Hang protocol, per job with hang_timeout_s > 0 and a running round (the
// state machine is HangDetector, hang_detector.h; the hub feeds it and does
// the work of each step):
//   armed      every rank reported "running" by a fresh report, and no rank's
//              progress (steps, collective_seq) changed for hang_timeout:
//              the culprits are named (HangCulprits) and their agents are
//              asked for stacks (MetricsReply.capture_stacks) -> capturing;
//              or, before any rank's first step, every rank reported
//              "running" and for hang_timeout some ranks never reached the
//              round's store (RankSample.reached_store) while others did:
//              the missing ranks are the culprits, the others wait for them
//              (for the keys MetricsReport.store_waits names) -> capturing
//   capturing  until every culprit's StackDump arrived or stack_wait passed:
//              ONE report is published (every agent's next reply, the view,
//              the failure report, the log) and on_hang is applied -> reported
//   reported   progress re-arms it (on_hang=report); restart and abort end
//              the round, and a new round starts armed.
//
// Thread-safe: one lock; callbacks (log, act) run without it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/job_policy.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/job_observer.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"
#include "ddprun/rendezvous/monitoring/monitoring_states.h"

namespace ddprun::rendezvous {

// Bounds on what an agent may send (more is dropped and counted, never an error).
inline constexpr std::size_t kMaxScalarsPerRank = 256;
inline constexpr std::size_t kMaxScalarNameBytes = 128;
inline constexpr std::size_t kMaxStepSecondsPerReport = 64;
inline constexpr std::size_t kMaxCollectiveOps = 32;
inline constexpr std::size_t kMaxEventsPerReport = 32;
inline constexpr std::size_t kMaxEventBytes = 512;
inline constexpr std::size_t kMaxStackBytes = 64 << 10;
inline constexpr std::size_t kMaxTimelineEvents = 1000;
// Step-time window (p50/p90) and straggler window, in steps.
inline constexpr std::size_t kStepWindow = 100;
inline constexpr std::size_t kStragglerWindow = 10;
inline constexpr std::size_t kStragglerMinSteps = 5;
// A rank whose median step time over its last kStragglerWindow steps is at
// least this much above the fastest rank's is a straggler.
inline constexpr double kStragglerRatio = 1.3;
// Capture stacks of at most this many culprits.
inline constexpr std::size_t kMaxStackCaptures = 8;

struct MetricsHubOptions {
  const Clock* clock = &SystemClock::Get();
  // The unix time at the clock's Now() when the hub is made (wall-clock
  // stamps on the timeline and series follow the injected clock from there).
  double unix_at_start = -1;  // < 0: the system's time now
  // How long to wait for the culprits' stacks before publishing without them.
  Duration stack_wait = std::chrono::seconds(5);
  // A node's report older than this does not prove its workers alive.
  Duration report_fresh = std::chrono::seconds(5);
  // Rates (steps/s, samples/s) over this window.
  Duration rate_window = std::chrono::seconds(10);
  // Time series: one point per resolution, `points` kept (20 min at 2 s).
  Duration series_resolution = std::chrono::seconds(2);
  std::size_t series_points = 600;
  // The daemon's log (one line per hang report); may be empty.
  std::function<void(const std::string&)> log;
  // Applies on_hang=restart|abort to the job table (without the hub's lock):
  // restart = the culprit node's agent failed with `failure`; abort = close
  // the job failed with `failure.error_message` as the reason.
  std::function<void(const std::string& job_id, std::int64_t round, const std::string& node_id,
                     OnHang action, const WorkerFailure& failure)>
      act;
};

// ---- The view: what the dashboard, /metrics and GetMetrics show.

struct RankView {
  int rank = -1;
  int local_rank = -1;
  std::string node_id;
  std::string host;
  std::int64_t pid = 0;
  RankState state = RankState::kUnknown;  // until the first report
  bool has_progress_source = false;
  bool reached_store = false;  // connected to the round's store (RankSample)
  std::int64_t steps = 0;
  double step_seconds_sum = 0;              // over every step of the round
  std::int64_t step_count = 0;              // steps with a known duration
  double step_p50_s = -1, step_p90_s = -1;  // < 0: no step yet
  double steps_per_s = 0;
  double samples_per_s = -1;  // < 0: unknown
  double samples_total = -1;
  std::int64_t collective_seq = 0;
  bool in_collective = false;
  std::string collective_op;
  double comm_seconds_total = 0;
  std::vector<CollectiveStat> collectives;
  std::map<std::string, double> scalars;
  std::int64_t scalars_dropped = 0;
  double cpu_percent = 0;
  std::uint64_t rss_bytes = 0;
  double gpu_util_percent = -1;
  std::uint64_t gpu_mem_bytes = 0;
  // Checkpoints in the agent's memory (RankSample): the newest committed
  // step and its bytes when has_checkpoint; the memory held in any case.
  bool has_checkpoint = false;
  std::int64_t checkpoint_step = 0;
  std::uint64_t checkpoint_bytes = 0;
  std::uint64_t checkpoint_memory_bytes = 0;
  bool straggler = false;
  double straggler_gap_s = 0;  // median step time minus the fastest rank's (DeepSpeed)
  double slowdown = 0;         // median step time / the fastest rank's (0: unknown)
  double report_unix_s = 0;    // the agent's sampling time of this data
  double age_s = -1;           // since the server received it; < 0: never
  std::int64_t anomalies = 0;  // values dropped or clamped (bad input)
};

struct SeriesPoint {
  double unix_s = 0;
  double samples_per_s = -1;
  double steps_per_s = 0;
  double step_time_s = -1;
};

struct TimelineEvent {
  double unix_s = 0;
  std::int64_t round = 0;
  std::string kind;  // "round", "restart", "join", "lost", "failure", "agent", "hang", "closed"
  std::string text;
};

struct JobView {
  std::string job_id;
  std::int64_t round = 0;
  JobState state = JobState::kGathering;
  int world_size = 0;
  int nodes = 0;
  int restart_count = 0;
  double hang_timeout_s = 0;
  std::string on_hang = "report";
  HangState hang_state = HangState::kOff;
  std::string hang_report;  // the latest published report
  std::int64_t hangs = 0;
  // Rounds that recovered from a restart, and the newest one's budget
  // (docs/recovery.md): each phase as the slowest node saw it.
  std::int64_t recoveries = 0;
  std::optional<RecoveryBudget> last_recovery;
  double samples_per_s = -1;
  double steps_per_s = 0;
  double step_time_s = -1;  // the slowest rank's median (the job's pace)
  double data_age_s = -1;   // the oldest running rank's data
  double now_unix_s = 0;
  std::vector<RankView> ranks;
  std::vector<SeriesPoint> series;
  std::vector<TimelineEvent> events;
  // The failure report of a failed job (or the failures so far).
  std::string close_reason;
  std::vector<WorkerFailure> failures;
};

struct HubCounters {
  std::int64_t reports = 0;
  std::int64_t reports_rejected = 0;
};

class MetricsHub final : public JobObserver {
 public:
  explicit MetricsHub(MetricsHubOptions options);
  ~MetricsHub() override;
  MetricsHub(const MetricsHub&) = delete;
  MetricsHub& operator=(const MetricsHub&) = delete;

  // One agent's report. FailedPrecondition (fenced) for an unknown job, a
  // round that is not running, or a node that is not a member; bad values
  // are clamped or dropped (counted in RankView::anomalies), never an error.
  absl::StatusOr<MetricsReply> Report(MetricsReport report);

  // Time-driven work: series points, hang detection, the stack wait. Call
  // about every second.
  void Tick();

  // JobObserver: rounds, restarts, the end of a job (under the table's lock).
  void OnJobChange(const JobChange& change) override;

  // One job's view (NotFound, fenced, for an unknown job); with_history
  // false leaves out series and events (for listings and /metrics).
  absl::StatusOr<JobView> View(const std::string& job_id, bool with_history = true) const;
  std::vector<JobView> Views(bool with_history = false) const;
  HubCounters counters() const;

  struct Job;  // defined in metrics_hub.cc

 private:
  double UnixNow() const;
  void TickJobLocked(Job& job, TimePoint now, std::vector<std::function<void()>>* after);
  // The hang detector's steps (hang_detector.h): name the culprits and ask
  // for their stacks; publish the report.
  void StartCaptureLocked(Job& job, TimePoint now);
  void PublishLocked(Job& job, TimePoint now, std::vector<std::function<void()>>* after);

  const MetricsHubOptions options_;
  const Clock& clock_;
  const TimePoint start_;
  double unix_at_start_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Job>, std::less<>> jobs_;
  HubCounters counters_;
};

}  // namespace ddprun::rendezvous
