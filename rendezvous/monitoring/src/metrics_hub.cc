#include "ddprun/rendezvous/monitoring/metrics_hub.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/monitoring/hang_detector.h"
#include "ddprun/rendezvous/monitoring/hang_report.h"
#include "rank_window.h"

namespace ddprun::rendezvous {
namespace {

constexpr double kMaxCount = 1e15;   // steps, samples: more is a bad value
constexpr double kMaxSeconds = 1e9;  // cumulative seconds
constexpr double kMaxStepSeconds = 1e6;
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 50;
constexpr std::size_t kMaxNameBytes = 64;  // collective op names

double Secs(Duration d) { return std::chrono::duration<double>(d).count(); }

// v when finite and within [lo, hi]; otherwise `bad` and one anomaly more.
double Clean(double v, double lo, double hi, double bad, std::int64_t* anomalies) {
  if (std::isfinite(v) && v >= lo && v <= hi) return v;
  ++*anomalies;
  if (std::isfinite(v) && v > hi) return hi;
  return bad;
}

std::string Cut(std::string s, std::size_t max, std::int64_t* anomalies) {
  if (s.size() > max) {
    s.resize(max);
    ++*anomalies;
  }
  return s;
}

// Names that become Prometheus label values and JSON keys: printable ASCII.
bool PrintableName(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------------ state

namespace {

struct RankData {
  explicit RankData(Duration rate_window)
      : steps(kStepWindow), compute(kStragglerWindow), rates(rate_window) {}
  RankView v;
  StepWindow steps;    // step durations
  StepWindow compute;  // step durations minus the step's time in collectives
  RateWindow rates;
  // Cached when a step arrives, so that a view of 8192 ranks costs O(ranks).
  double compute_median = -1;
  bool seen = false;
  TimePoint received{};
};

struct NodeState {
  std::string host;
  std::int64_t pid = 0;
  int base_rank = 0;
  int nproc = 0;
  bool reported = false;
  TimePoint last_report{};
  std::vector<int> capture;  // ranks whose stacks the next reply asks for
  bool hang_report_due = false;
  std::vector<std::string> store_waits;  // if it hosts the round's store
};

// How long a published restart or abort waits for every agent to fetch the
// hang report: one report interval.
constexpr Duration kHangDeliveryWait = std::chrono::seconds(2);

// A rank of the round. Its state is made on its first report, not when the
// round starts: a round of 16k nodes has 131k ranks, and making every state
// then (under the job table's lock, before any Assignment goes out) measured
// most of the job table's time for the round.
struct RankSlot {
  int rank = -1;
  int local_rank = -1;
  const std::string* node_id = nullptr;  // a key of Job::nodes (rebuilt together)
  const NodeState* node = nullptr;       // that key's value
  std::unique_ptr<RankData> state;       // null until the rank's first report
  // Set when the job closed: how the worker ended (exited, failed, stopped);
  // it overrides the last report, which may still say running.
  std::optional<RankState> end_state;
};

// The slot's view: its state's, or a rank not heard from yet; a closed job's
// ranks carry their end state.
RankView ViewOf(const RankSlot& slot) {
  RankView v;
  if (slot.state) {
    v = slot.state->v;
  } else {
    v.rank = slot.rank;
    v.local_rank = slot.local_rank;
    v.node_id = *slot.node_id;
    v.host = slot.node->host;
  }
  if (slot.end_state) v.state = *slot.end_state;
  return v;
}

// Rank `rank`'s slot in a rank-ordered vector; null if it has none.
RankSlot* FindRank(std::vector<RankSlot>& ranks, int rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                             [](const RankSlot& r, int x) { return r.rank < x; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

// The end state of each rank of a job that closed: a rank in `failures` (of
// the last round) failed; one whose agent already reported it ended keeps
// that; the others exited (the job succeeded) or were stopped (it failed).
void SettleRanks(std::vector<RankSlot>& ranks, std::int64_t round, bool success,
                 const std::vector<WorkerFailure>& failures) {
  for (RankSlot& slot : ranks) {
    const RankState last = slot.state ? slot.state->v.state : RankState::kUnknown;
    if (last == RankState::kExited || last == RankState::kFailed || last == RankState::kStopped) {
      slot.end_state = last;
    } else {
      slot.end_state = success ? RankState::kExited : RankState::kStopped;
    }
  }
  for (const WorkerFailure& f : failures) {
    if (f.round != round) continue;
    if (RankSlot* slot = FindRank(ranks, f.global_rank)) slot->end_state = RankState::kFailed;
  }
}

}  // namespace

struct MetricsHub::Job {
  explicit Job(Duration stack_wait) : hang(stack_wait, kHangDeliveryWait) {}
  std::string id;
  std::int64_t round = 0;
  JobState state = JobState::kGathering;
  int world_size = 0;
  int restart_count = 0;
  double hang_timeout_s = 0;
  OnHang on_hang = OnHang::kReport;
  std::map<std::string, NodeState> nodes;
  // The round's ranks in rank order (FindRank looks one up).
  std::vector<RankSlot> ranks;
  std::deque<SeriesPoint> series;
  std::optional<TimePoint> next_point;
  std::deque<TimelineEvent> events;
  // Hang detection: the protocol, and the report it is about.
  HangDetector hang;
  HangReportInput pending;  // while capturing
  std::vector<int> stacks_wanted;
  std::string hang_report;
  std::int64_t hangs = 0;
  std::string act_node;
  WorkerFailure act_failure;
  // The end.
  std::string close_reason;
  std::vector<WorkerFailure> failures;
  // When the job closed: views compute ages and rates as of then.
  std::optional<TimePoint> ended;
  TimePoint round_started{};
  // Recovery budgets (docs/recovery.md): each node's record of the newest
  // round that recovered, and how many rounds did.
  std::int64_t recovery_round = 0;
  std::map<std::string, RecoveryBudget> recovery_nodes;
  std::int64_t recoveries = 0;
};

MetricsHub::MetricsHub(MetricsHubOptions options)
    : options_(std::move(options)), clock_(*options_.clock), start_(clock_.Now()) {
  unix_at_start_ =
      options_.unix_at_start >= 0
          ? options_.unix_at_start
          : std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count();
}

MetricsHub::~MetricsHub() = default;

double MetricsHub::UnixNow() const { return unix_at_start_ + Secs(clock_.Now() - start_); }

namespace {

void AddEvent(MetricsHub::Job& job, double unix_s, std::string kind, std::string text);

}  // namespace

// --------------------------------------------------------------- observer

void MetricsHub::OnJobChange(const JobChange& c) {
  std::lock_guard<std::mutex> lock(mu_);
  const double unix_now = UnixNow();
  if (c.kind == JobChange::Kind::kForgotten) {
    jobs_.erase(c.job_id);
    return;
  }
  auto it = jobs_.find(c.job_id);
  if (it == jobs_.end()) {
    auto job = std::make_unique<Job>(options_.stack_wait);
    job->id = c.job_id;
    it = jobs_.emplace(c.job_id, std::move(job)).first;
  }
  Job& job = *it->second;
  switch (c.kind) {
    case JobChange::Kind::kEvent:
      AddEvent(job, unix_now, c.tag.empty() ? "event" : c.tag, c.text);
      break;
    case JobChange::Kind::kRoundStarted: {
      job.round = c.round;
      job.state = JobState::kRunning;
      job.ended.reset();
      job.round_started = clock_.Now();
      job.world_size = c.world_size;
      job.restart_count = c.restart_count;
      job.hang_timeout_s = std::isfinite(c.policy.hang_timeout_s) ? c.policy.hang_timeout_s : 0;
      job.on_hang = c.policy.on_hang;
      job.nodes.clear();
      job.ranks.clear();
      std::size_t total = 0;
      for (const NodeInfo& n : c.nodes) total += static_cast<std::size_t>(std::max(0, n.nproc));
      job.ranks.reserve(total);
      for (std::size_t i = 0; i < c.nodes.size() && i < c.node_ids.size(); ++i) {
        const NodeInfo& n = c.nodes[i];
        NodeState ns;
        ns.host = n.host;
        ns.pid = n.pid;
        ns.base_rank = n.base_rank;
        ns.nproc = n.nproc;
        auto [nit, added] = job.nodes.insert_or_assign(c.node_ids[i], std::move(ns));
        for (int l = 0; l < n.nproc; ++l) {
          RankSlot& slot = job.ranks.emplace_back();
          slot.rank = n.base_rank + l;
          slot.local_rank = l;
          slot.node_id = &nit->first;
          slot.node = &nit->second;
        }
      }
      // Nodes come in base-rank order; sort anyway, one slot per rank.
      auto by_rank = [](const RankSlot& a, const RankSlot& b) { return a.rank < b.rank; };
      if (!std::is_sorted(job.ranks.begin(), job.ranks.end(), by_rank)) {
        std::stable_sort(job.ranks.begin(), job.ranks.end(), by_rank);
      }
      job.ranks.erase(
          std::unique(job.ranks.begin(), job.ranks.end(),
                      [](const RankSlot& a, const RankSlot& b) { return a.rank == b.rank; }),
          job.ranks.end());
      job.hang.StartRound(clock_.Now(), job.hang_timeout_s, job.on_hang);
      job.stacks_wanted.clear();
      AddEvent(job, unix_now, "round",
               absl::StrCat("round ", c.round, " running: ", c.nodes.size(),
                            " node(s), world size ", c.world_size, ", restarts ", c.restart_count));
      break;
    }
    case JobChange::Kind::kRestart:
      job.state = JobState::kGathering;
      job.hang.EndRound();
      for (auto& [id, n] : job.nodes) n.capture.clear();
      AddEvent(job, unix_now, "restart",
               absl::StrCat("round ", c.round, " ends", c.counts_as_failure ? " (a failure)" : "",
                            ": ", c.text));
      break;
    case JobChange::Kind::kClosed:
      job.state = c.success ? JobState::kSucceeded : JobState::kFailed;
      job.close_reason = c.text;
      job.failures = c.failures;
      job.ended = clock_.Now();
      SettleRanks(job.ranks, job.round, c.success, c.failures);
      job.hang.Close();
      AddEvent(job, unix_now, "closed",
               absl::StrCat(c.success ? "succeeded: " : "failed: ", c.text));
      break;
    case JobChange::Kind::kForgotten:
      break;
  }
}

namespace {

void AddEvent(MetricsHub::Job& job, double unix_s, std::string kind, std::string text) {
  job.events.push_back({unix_s, job.round, std::move(kind), std::move(text)});
  while (job.events.size() > kMaxTimelineEvents) job.events.pop_front();
}

// A sample's values into the rank's state, clamped; returns whether the
// rank progressed (steps or collective number moved, or it reached the
// round's store: a rank slow to start that arrives is not hung).
bool Ingest(RankData& r, RankSample s, TimePoint now, double unix_s) {
  RankView& v = r.v;
  std::int64_t& bad = v.anomalies;
  if (s.pid > 0) v.pid = s.pid;
  const std::optional<RankState> state = ParseRankState(s.state);
  v.state = state ? *state : (++bad, RankState::kUnknown);
  v.has_progress_source = s.has_progress_source;
  const std::int64_t prev_steps = v.steps;
  const std::int64_t prev_seq = v.collective_seq;
  const bool arrived = s.reached_store && !v.reached_store;
  v.reached_store = v.reached_store || s.reached_store;
  const double prev_comm = v.comm_seconds_total;

  const auto steps = static_cast<std::int64_t>(
      Clean(static_cast<double>(s.steps), 0, kMaxCount, static_cast<double>(prev_steps), &bad));
  if (steps < prev_steps) {
    ++bad;  // steps going backwards: keep the count we had
  } else {
    v.steps = steps;
  }
  const double samples = Clean(s.samples_total, -1, kMaxCount, -1, &bad);
  if (samples >= 0 && v.samples_total >= 0 && samples < v.samples_total) {
    ++bad;
  } else {
    v.samples_total = samples < 0 ? -1 : samples;
  }
  const auto seq = static_cast<std::int64_t>(Clean(static_cast<double>(s.collective_seq), 0,
                                                   kMaxCount, static_cast<double>(prev_seq), &bad));
  if (seq < prev_seq) {
    ++bad;
  } else {
    v.collective_seq = seq;
  }
  v.in_collective = s.in_collective;
  v.collective_op = Cut(std::move(s.collective_op), kMaxNameBytes, &bad);
  if (!PrintableName(v.collective_op)) v.collective_op = (++bad, "?");
  const double comm = Clean(s.comm_seconds_total, 0, kMaxSeconds, prev_comm, &bad);
  v.comm_seconds_total = std::max(comm, prev_comm);

  // Durations of the steps completed since the last report: at most as many
  // as the count moved, the newest ones.
  const std::int64_t moved = v.steps - prev_steps;
  std::size_t take = std::min<std::size_t>(
      {s.step_seconds.size(), kMaxStepSecondsPerReport, static_cast<std::size_t>(moved)});
  if (s.step_seconds.size() > take) bad += static_cast<std::int64_t>(s.step_seconds.size() - take);
  const double comm_per_step =
      take > 0 ? (v.comm_seconds_total - prev_comm) / static_cast<double>(take) : 0;
  for (std::size_t i = s.step_seconds.size() - take; i < s.step_seconds.size(); ++i) {
    const double d = s.step_seconds[i];
    if (!std::isfinite(d) || d <= 0 || d > kMaxStepSeconds) {
      ++bad;
      continue;
    }
    r.steps.Add(d);
    r.compute.Add(std::max(d - comm_per_step, d * 0.01));
    v.step_seconds_sum += d;
    ++v.step_count;
  }

  if (take > 0) {
    v.step_p50_s = r.steps.Quantile(0.5);
    v.step_p90_s = r.steps.Quantile(0.9);
    r.compute_median = r.compute.size() >= kStragglerMinSteps ? r.compute.Quantile(0.5) : -1;
  }

  v.collectives.clear();
  for (auto& c : s.collectives) {
    if (v.collectives.size() == kMaxCollectiveOps) {
      ++bad;
      break;
    }
    CollectiveStat out;
    out.op = Cut(std::move(c.op), kMaxNameBytes, &bad);
    if (!PrintableName(out.op)) {
      ++bad;
      out.op = "?";
    }
    out.count =
        static_cast<std::int64_t>(Clean(static_cast<double>(c.count), 0, kMaxCount, 0, &bad));
    out.bytes_total =
        static_cast<std::int64_t>(Clean(static_cast<double>(c.bytes_total), 0, kMaxCount, 0, &bad));
    out.seconds_total = Clean(c.seconds_total, 0, kMaxSeconds, 0, &bad);
    out.busbw_gbps = Clean(c.busbw_gbps, 0, 1e6, 0, &bad);
    v.collectives.push_back(std::move(out));
  }

  v.scalars.clear();
  v.scalars_dropped = static_cast<std::int64_t>(
      Clean(static_cast<double>(s.scalars_dropped), 0, kMaxCount, 0, &bad));
  for (auto& [name, value] : s.scalars) {
    if (name.empty() || name.size() > kMaxScalarNameBytes || !PrintableName(name) ||
        !std::isfinite(value) || v.scalars.size() == kMaxScalarsPerRank) {
      ++v.scalars_dropped;
      continue;
    }
    v.scalars.emplace(name, value);
  }

  v.cpu_percent = Clean(s.cpu_percent, 0, 100.0 * 4096, 0, &bad);
  v.rss_bytes = std::min(s.rss_bytes, kMaxBytes);
  v.gpu_util_percent = Clean(s.gpu_util_percent, -1, 100, -1, &bad);
  if (v.gpu_util_percent < 0) v.gpu_util_percent = -1;
  v.gpu_mem_bytes = v.gpu_util_percent >= 0 ? std::min(s.gpu_mem_bytes, kMaxBytes) : 0;
  v.has_checkpoint = s.has_checkpoint;
  v.checkpoint_step = v.has_checkpoint ? s.checkpoint_step : 0;
  v.checkpoint_bytes = v.has_checkpoint ? std::min(s.checkpoint_bytes, kMaxBytes) : 0;
  v.checkpoint_memory_bytes = std::min(s.checkpoint_memory_bytes, kMaxBytes);

  r.rates.Add(now, static_cast<double>(v.steps), v.samples_total);
  r.seen = true;
  r.received = now;
  v.report_unix_s = unix_s;
  return v.steps != prev_steps || v.collective_seq != prev_seq || arrived;
}

}  // namespace

// ------------------------------------------------------------------ reports

absl::StatusOr<MetricsReply> MetricsHub::Report(MetricsReport report) {
  if (absl::Status st = ValidateJobId(report.job_id); !st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.reports_rejected;
    return absl::InvalidArgumentError(std::string(st.message()));
  }
  std::vector<std::function<void()>> after;
  MetricsReply reply;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = clock_.Now();
    auto refuse = [&](std::string why) {
      ++counters_.reports_rejected;
      return absl::FailedPreconditionError(Fence(report.job_id, report.round) + why);
    };
    auto it = jobs_.find(report.job_id);
    if (it == jobs_.end()) {
      return refuse("metrics for a job this server does not know; the agent must join it first");
    }
    Job& job = *it->second;
    if (job.state != JobState::kRunning || report.round != job.round) {
      return refuse(absl::StrCat("metrics for a round that is not running (the job is ",
                                 Name(job.state), " in round ", job.round,
                                 "); the agent must re-join"));
    }
    auto nit = job.nodes.find(report.node_id);
    if (nit == job.nodes.end()) {
      return refuse("metrics from a node that is not a member of the running round");
    }
    NodeState& node = nit->second;
    ++counters_.reports;
    node.reported = true;
    node.last_report = now;
    const double unix_s =
        std::isfinite(report.unix_s) && report.unix_s > 0 ? report.unix_s : UnixNow();
    if (report.recovery && report.recovery->outcome == "recovered" &&
        report.recovery->round == job.round && job.round >= job.recovery_round) {
      RecoveryBudget b = std::move(*report.recovery);
      std::int64_t ignored = 0;  // a bad phase reads as not reached
      for (double* ms : {&b.stopped_ms, &b.round_ms, &b.started_ms, &b.first_step_ms}) {
        *ms = Clean(*ms, 0, kMaxStepSeconds * 1000, -1, &ignored);
      }
      b.cause = Cut(std::move(b.cause), kMaxEventBytes, &ignored);
      if (job.recovery_nodes.empty() || job.round > job.recovery_round) {
        job.recovery_round = job.round;
        job.recovery_nodes.clear();
        ++job.recoveries;
      }
      job.recovery_nodes[report.node_id] = std::move(b);
    }
    bool progressed = false;
    std::set<int> done;
    for (auto& s : report.ranks) {
      if (s.rank < node.base_rank || s.rank >= node.base_rank + node.nproc) continue;
      if (!done.insert(s.rank).second) continue;  // a rank twice in one report
      RankSlot* slot = FindRank(job.ranks, s.rank);
      if (slot == nullptr) continue;
      if (!slot->state) {
        slot->state = std::make_unique<RankData>(options_.rate_window);
        RankView& v = slot->state->v;
        v.rank = slot->rank;
        v.local_rank = slot->local_rank;
        v.node_id = *slot->node_id;
        v.host = slot->node->host;
      }
      progressed |= Ingest(*slot->state, std::move(s), now, unix_s);
    }
    node.store_waits.clear();
    for (auto& k : report.store_waits) {
      if (node.store_waits.size() == kMaxStoreWaitKeys) break;
      std::int64_t ignored = 0;
      node.store_waits.push_back(Cut(std::move(k), kMaxStoreKeyBytes, &ignored));
    }
    std::int64_t events = 0;
    for (auto& e : report.events) {
      if (++events > static_cast<std::int64_t>(kMaxEventsPerReport)) break;
      std::int64_t ignored = 0;
      AddEvent(job, UnixNow(), "agent",
               node.host + ": " + Cut(std::move(e), kMaxEventBytes, &ignored));
    }
    if (progressed) {
      // A slow rank that moves is not hung: a pending capture is dropped, a
      // published report re-arms.
      const HangDetector::Progress p = job.hang.ObserveProgress(now);
      if (p == HangDetector::Progress::kCaptureDropped) {
        AddEvent(job, UnixNow(), "hang", "progress resumed before the hang report; none sent");
      }
      if (p != HangDetector::Progress::kNone) {
        job.stacks_wanted.clear();
        for (auto& [id, n] : job.nodes) n.capture.clear();
      }
    }
    if (job.hang.phase() == HangDetector::Phase::kCapturing) {
      for (auto& d : report.stacks) {
        if (d.rank < node.base_rank || d.rank >= node.base_rank + node.nproc) continue;
        if (!std::binary_search(job.stacks_wanted.begin(), job.stacks_wanted.end(), d.rank))
          continue;
        std::int64_t ignored = 0;
        d.text = Cut(std::move(d.text), kMaxStackBytes, &ignored);
        d.error = Cut(std::move(d.error), kMaxEventBytes, &ignored);
        d.kind = Cut(std::move(d.kind), kMaxNameBytes, &ignored);
        job.pending.stacks[d.rank] = std::move(d);
      }
      // Every stack in: publish now rather than at the end of the wait.
      if (job.pending.stacks.size() >= job.stacks_wanted.size()) job.hang.StacksComplete(now);
    }
    TickJobLocked(job, now, &after);
    reply.capture_stacks = std::move(node.capture);
    node.capture.clear();
    if (node.hang_report_due) {
      reply.hang_report = job.hang_report;
      node.hang_report_due = false;
    }
  }
  for (auto& f : after) f();
  return reply;
}

// -------------------------------------------------------------------- tick

void MetricsHub::Tick() {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = clock_.Now();
    for (auto& [id, job] : jobs_) TickJobLocked(*job, now, &after);
  }
  for (auto& f : after) f();
}

namespace {

struct Aggregate {
  double samples_per_s = -1;
  double steps_per_s = 0;
  double step_time_s = -1;
};

// Per-rank rates, quantiles and stragglers as of now; the job's totals.
Aggregate Compute(std::vector<RankSlot>& ranks, TimePoint now) {
  Aggregate a;
  double fastest = -1;
  int counted = 0;
  for (auto& slot : ranks) {
    ++counted;  // a rank not heard from yet counts as 0 steps/s
    if (!slot.state) continue;
    RankData& r = *slot.state;
    RankView& v = r.v;
    v.steps_per_s = r.rates.StepsPerSecond(now);
    v.samples_per_s = r.rates.SamplesPerSecond(now);
    v.age_s = r.seen ? Secs(now - r.received) : -1;
    if (v.samples_per_s >= 0) a.samples_per_s = std::max(0.0, a.samples_per_s) + v.samples_per_s;
    a.steps_per_s += v.steps_per_s;
    if (v.step_p50_s > a.step_time_s) a.step_time_s = v.step_p50_s;
    if (r.compute_median > 0 && (fastest < 0 || r.compute_median < fastest)) {
      fastest = r.compute_median;
    }
  }
  if (counted > 0) a.steps_per_s /= counted;  // the job's steps/s: the ranks' mean
  for (auto& slot : ranks) {
    if (!slot.state) continue;
    RankData& r = *slot.state;
    RankView& v = r.v;
    v.straggler = false;
    v.straggler_gap_s = 0;
    v.slowdown = 0;
    if (fastest > 0 && r.compute_median > 0) {
      const double med = r.compute_median;
      v.straggler_gap_s = med - fastest;
      v.slowdown = med / fastest;
      v.straggler = v.slowdown >= kStragglerRatio && v.state == RankState::kRunning;
    }
  }
  return a;
}

}  // namespace

void MetricsHub::TickJobLocked(Job& job, TimePoint now, std::vector<std::function<void()>>* after) {
  if (job.state != JobState::kRunning) return;
  // The time series: one point per resolution.
  if (!job.next_point || now >= *job.next_point) {
    const Aggregate a = Compute(job.ranks, now);
    job.series.push_back({UnixNow(), a.samples_per_s, a.steps_per_s, a.step_time_s});
    while (job.series.size() > options_.series_points) job.series.pop_front();
    job.next_point = now + options_.series_resolution;
  }

  // Every worker alive by a fresh report, and something that counts progress.
  auto ranks_ready = [&] {
    if (job.ranks.empty()) return false;
    bool source = false;
    for (const auto& slot : job.ranks) {
      const RankData* r = slot.state.get();
      if (!r || !r->seen || r->v.state != RankState::kRunning ||
          now - r->received > options_.report_fresh)
        return false;
      source |= r->v.has_progress_source || r->v.collective_seq > 0;
    }
    return source;
  };
  // No rank made a first step; some reached the round's store (they wait
  // there, inside init_process_group) and some never did.
  auto startup_stalled = [&] {
    bool reached = false, missing = false;
    for (const auto& slot : job.ranks) {
      const RankData* r = slot.state.get();
      if (!r || !r->seen || r->v.state != RankState::kRunning ||
          now - r->received > options_.report_fresh)
        return false;
      if (r->v.steps > 0 || r->v.collective_seq > 0) return false;
      (r->v.reached_store ? reached : missing) = true;
    }
    return reached && missing;
  };
  auto delivered = [&] {
    bool all = true;
    for (const auto& [id, n] : job.nodes) all &= !n.hang_report_due;
    return all;
  };
  HangDetector::Step step = job.hang.Tick(now, ranks_ready, startup_stalled, delivered);
  switch (step) {
    case HangDetector::Step::kNone:
    case HangDetector::Step::kAct:
      break;
    case HangDetector::Step::kCapture:
      StartCaptureLocked(job, now);
      return;
    case HangDetector::Step::kPublish:
      PublishLocked(job, now, after);
      // A report may wait for its delivery; restart and abort apply at once
      // when every agent has it.
      step = job.hang.Tick(now, ranks_ready, startup_stalled, delivered);
      break;
  }
  if (step == HangDetector::Step::kAct && options_.act) {
    after->push_back([act = options_.act, id = job.id, round = job.round, node = job.act_node,
                      what = job.on_hang, f = job.act_failure] { act(id, round, node, what, f); });
  }
}

void MetricsHub::StartCaptureLocked(Job& job, TimePoint now) {
  const bool startup = job.hang.cause() == HangDetector::Cause::kStartup;
  std::vector<HangRank> hr;
  hr.reserve(job.ranks.size());
  for (const auto& slot : job.ranks) {
    const RankData& r = *slot.state;  // every rank reported (ranks_ready, startup_stalled)
    hr.push_back({r.v.rank, r.v.host, r.v.pid, r.v.steps, r.v.collective_seq, r.v.in_collective,
                  r.v.collective_op});
    if (startup) hr.back().store = r.v.reached_store ? StoreReach::kReached : StoreReach::kNever;
  }
  job.pending = HangReportInput{};
  job.pending.job_id = job.id;
  job.pending.round = job.round;
  job.pending.hang_timeout_s = job.hang_timeout_s;
  job.pending.on_hang = OnHangName(job.on_hang);
  if (startup) {
    std::vector<std::string> keys;
    for (const auto& [id, n] : job.nodes)
      keys.insert(keys.end(), n.store_waits.begin(), n.store_waits.end());
    job.pending.startup = true;
    job.pending.verdict = FindStartupCulprits(hr, keys);
  } else {
    job.pending.verdict = FindHangCulprits(hr);
  }
  job.pending.ranks = std::move(hr);
  job.stacks_wanted.assign(job.pending.verdict.culprits.begin(),
                           job.pending.verdict.culprits.begin() +
                               static_cast<std::ptrdiff_t>(std::min(
                                   kMaxStackCaptures, job.pending.verdict.culprits.size())));
  for (int c : job.stacks_wanted) {
    if (const RankSlot* slot = FindRank(job.ranks, c)) {
      job.nodes[*slot->node_id].capture.push_back(c);
    }
  }
  AddEvent(job, UnixNow(), "hang",
           absl::StrCat(startup ? "no first step and rank(s) missing from the store for "
                                : "no progress for ",
                        static_cast<long>(job.hang_timeout_s),
                        " s; asking for the stacks of rank(s) ", RankList(job.stacks_wanted)));
}

void MetricsHub::PublishLocked(Job& job, TimePoint now, std::vector<std::function<void()>>* after) {
  // A startup hang counts from the round's start (arrivals in the store
  // restarted the detector's timer, but no rank ever made a step).
  job.pending.stalled_s =
      Secs(now - (job.pending.startup ? job.round_started : job.hang.last_progress()));
  RefineHangWithStacks(job.pending.verdict, job.pending.stacks);
  job.hang_report = FormatHangReport(job.pending);
  ++job.hangs;
  AddEvent(job, UnixNow(), "hang",
           absl::StrCat("hang: culprit rank(s) ", RankList(job.pending.verdict.culprits)));
  for (auto& [id, n] : job.nodes) n.hang_report_due = true;
  if (options_.log) {
    after->push_back([log = options_.log, text = job.hang_report] { log(text); });
  }
  // The job's failure report names the first culprit.
  const int c = job.pending.verdict.culprits.front();
  const RankSlot* culprit = FindRank(job.ranks, c);  // one of the ranks
  const RankView r = culprit ? ViewOf(*culprit) : RankView{};
  WorkerFailure f;
  f.host = r.host;
  f.global_rank = c;
  f.local_rank = r.local_rank;
  f.pid = r.pid;
  f.timestamp = UnixNow();
  f.round = job.round;
  f.error_message = job.hang_report;
  job.act_node = r.node_id;
  job.act_failure = std::move(f);
  job.stacks_wanted.clear();
}

// ------------------------------------------------------------------- views

absl::StatusOr<JobView> MetricsHub::View(const std::string& job_id, bool with_history) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("[job ", job_id.size() <= kMaxJobIdBytes ? job_id : job_id.substr(0, 64),
                     "] no such job on this server; `ddprun status` lists the jobs"));
  }
  Job& job = *it->second;
  // A closed job's figures stay as they were at its end (no growing age).
  const TimePoint now = job.ended.value_or(clock_.Now());
  const Aggregate a = Compute(job.ranks, now);
  JobView v;
  v.job_id = job.id;
  v.round = job.round;
  v.state = job.state;
  v.world_size = job.world_size;
  v.nodes = static_cast<int>(job.nodes.size());
  v.restart_count = job.restart_count;
  v.hang_timeout_s = job.hang_timeout_s;
  v.on_hang = OnHangName(job.on_hang);
  bool source = false;
  for (const auto& slot : job.ranks) {
    if (slot.state) source |= slot.state->v.has_progress_source || slot.state->v.collective_seq > 0;
  }
  if (job.hang_timeout_s <= 0) {
    v.hang_state = HangState::kOff;
  } else if (job.state != JobState::kRunning) {
    v.hang_state = job.state == JobState::kGathering ? HangState::kArmed : HangState::kOff;
  } else if (!source && job.hang.phase() == HangDetector::Phase::kArmed) {
    v.hang_state = HangState::kNoProgressSource;  // only a startup hang can be found
  } else {
    v.hang_state = job.hang.phase() == HangDetector::Phase::kArmed       ? HangState::kArmed
                   : job.hang.phase() == HangDetector::Phase::kCapturing ? HangState::kCapturing
                                                                         : HangState::kReported;
  }
  v.hang_report = job.hang_report;
  v.hangs = job.hangs;
  v.recoveries = job.recoveries;
  // The job's last recovery: each phase as its slowest node saw it; the
  // cause a node named a worker for, else the first node's.
  for (const auto& [node_id, b] : job.recovery_nodes) {
    if (!v.last_recovery) {
      v.last_recovery = b;
      continue;
    }
    RecoveryBudget& m = *v.last_recovery;
    m.stopped_ms = std::max(m.stopped_ms, b.stopped_ms);
    m.round_ms = std::max(m.round_ms, b.round_ms);
    m.started_ms = std::max(m.started_ms, b.started_ms);
    m.first_step_ms = std::max(m.first_step_ms, b.first_step_ms);
    if (m.cause.rfind("worker", 0) != 0 && b.cause.rfind("worker", 0) == 0) m.cause = b.cause;
  }
  v.samples_per_s = a.samples_per_s;
  v.steps_per_s = a.steps_per_s;
  v.step_time_s = a.step_time_s;
  v.now_unix_s = UnixNow();
  v.ranks.reserve(job.ranks.size());
  for (const auto& slot : job.ranks) {
    v.ranks.push_back(ViewOf(slot));
    if (job.state == JobState::kRunning && slot.state && slot.state->seen) {
      v.data_age_s = std::max(v.data_age_s, slot.state->v.age_s);
    }
  }
  if (with_history) {
    v.series.assign(job.series.begin(), job.series.end());
    v.events.assign(job.events.begin(), job.events.end());
  }
  v.close_reason = job.close_reason;
  v.failures = job.failures;
  return v;
}

std::vector<JobView> MetricsHub::Views(bool with_history) const {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, job] : jobs_) ids.push_back(id);
  }
  std::vector<JobView> out;
  for (const auto& id : ids) {
    auto v = View(id, with_history);
    if (v.ok()) out.push_back(std::move(*v));
  }
  return out;
}

HubCounters MetricsHub::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace ddprun::rendezvous
