#include "ddprun/rendezvous/monitoring/prometheus_text.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "ddprun/rendezvous/monitoring/monitoring_states.h"

namespace ddprun::rendezvous {
namespace {

std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// One family's samples for one job or rank: `name{labels} value` lines.
class Samples {
 public:
  Samples(std::string* out, const char* name, const std::string& labels)
      : out_(out), name_(name), labels_(labels) {}
  // name{labels} v
  void Add(double v) { Line(nullptr, nullptr, v); }
  // name{labels,extra} v
  void Add(const std::string& extra, double v) { Line(nullptr, &extra, v); }
  // name<suffix>{labels} v (a summary's _sum and _count)
  void AddSuffixed(const char* suffix, double v) { Line(suffix, nullptr, v); }

 private:
  void Line(const char* suffix, const std::string* extra, double v) {
    *out_ += name_;
    if (suffix != nullptr) *out_ += suffix;
    if (!labels_.empty() || extra != nullptr) {
      *out_ += '{';
      *out_ += labels_;
      if (extra != nullptr) {
        if (!labels_.empty()) *out_ += ',';
        *out_ += *extra;
      }
      *out_ += '}';
    }
    *out_ += ' ';
    *out_ += Num(v);
    *out_ += '\n';
  }

  std::string* out_;
  const char* name_;
  const std::string& labels_;
};

std::string Label(const char* name, const std::string& value) {
  return std::string(name) + "=\"" + EscapeLabelValue(value) + "\"";
}

std::string JobLabels(const JobView& j) {
  return Label("job", j.job_id) + "," + Label("round", std::to_string(j.round));
}

std::string RankLabels(const JobView& j, const RankView& r) {
  return Label("job", j.job_id) + "," + Label("node", r.node_id) + "," +
         Label("rank", std::to_string(r.rank)) + "," + Label("round", std::to_string(j.round));
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// What a family's samples are about: the server, each job, or each rank of
// each running job.
enum class Scope { kServer, kJob, kRank };

// The subject of one family's samples; `job` and `rank` are set as the
// scope needs.
struct Subject {
  const HubCounters& counters;
  const JobView* job = nullptr;
  const RankView* rank = nullptr;
};

// One metric family: a row of the table below. `samples` adds the family's
// samples for one subject (none when the value is unknown).
struct Family {
  const char* name;
  const char* type;
  const char* help;
  Scope scope;
  void (*samples)(const Subject& s, Samples& out);
};

// A rank's samples per collective operation, the operation a label.
void PerOp(const RankView& r, Samples& out, double (*get)(const CollectiveStat&)) {
  for (const auto& c : r.collectives) out.Add(Label("op", c.op), get(c));
}

// The families in the order /metrics lists them (docs/monitoring.md).
constexpr Family kFamilies[] = {
    {"ddprun_metrics_reports_total", "counter",
     "Metrics reports accepted from agents by this server.", Scope::kServer,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.counters.reports)); }},
    {"ddprun_metrics_reports_rejected_total", "counter",
     "Metrics reports refused (unknown job, stale round, not a member).", Scope::kServer,
     [](const Subject& s, Samples& out) {
       out.Add(static_cast<double>(s.counters.reports_rejected));
     }},
    // Per job.
    {"ddprun_job_info", "gauge", "1 for every job; its state is a label.", Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(Label("state", Name(s.job->state)), 1); }},
    {"ddprun_job_world_size", "gauge", "Workers (ranks) in the job's current round.", Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(s.job->world_size); }},
    {"ddprun_job_restarts_total", "counter", "Failure restarts of the job so far.", Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(s.job->restart_count); }},
    {"ddprun_job_recoveries_total", "counter",
     "Restarts the job recovered from: a step completed after them (docs/recovery.md).",
     Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.job->recoveries)); }},
    {"ddprun_job_recovery_seconds", "gauge",
     "The last recovery's phases in seconds from the failure's detection, as the slowest node "
     "saw each (absent before the first recovery).",
     Scope::kJob,
     [](const Subject& s, Samples& out) {
       if (!s.job->last_recovery) return;
       const RecoveryBudget& b = *s.job->last_recovery;
       const std::pair<const char*, double> phases[] = {{"stopped", b.stopped_ms},
                                                        {"round", b.round_ms},
                                                        {"started", b.started_ms},
                                                        {"first_step", b.first_step_ms}};
       for (const auto& [phase, ms] : phases) {
         if (ms >= 0) out.Add(Label("phase", phase), ms / 1000.0);
       }
     }},
    {"ddprun_job_samples_per_second", "gauge",
     "Samples per second of all ranks together (absent when no rank knows its batch size).",
     Scope::kJob,
     [](const Subject& s, Samples& out) {
       if (s.job->samples_per_s >= 0) out.Add(s.job->samples_per_s);
     }},
    {"ddprun_job_steps_per_second", "gauge", "Mean steps per second over the ranks.", Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(s.job->steps_per_s); }},
    {"ddprun_job_step_time_seconds", "gauge",
     "The slowest rank's median step time (the job's pace).", Scope::kJob,
     [](const Subject& s, Samples& out) {
       if (s.job->step_time_s >= 0) out.Add(s.job->step_time_s);
     }},
    {"ddprun_job_hangs_total", "counter", "Hang reports published for the job.", Scope::kJob,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.job->hangs)); }},
    {"ddprun_job_hung", "gauge", "1 while a hang is being captured or reported.", Scope::kJob,
     [](const Subject& s, Samples& out) {
       out.Add(s.job->hang_state == HangState::kCapturing ||
                       s.job->hang_state == HangState::kReported
                   ? 1
                   : 0);
     }},
    {"ddprun_job_data_age_seconds", "gauge", "Age of the oldest rank's latest data on this server.",
     Scope::kJob,
     [](const Subject& s, Samples& out) {
       if (s.job->data_age_s >= 0) out.Add(s.job->data_age_s);
     }},
    // Per rank of a running job.
    {"ddprun_rank_running", "gauge", "1 while the worker runs, 0 otherwise.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->state == RankState::kRunning ? 1 : 0); }},
    {"ddprun_rank_steps_total", "counter", "Training steps completed in this round.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.rank->steps)); }},
    {"ddprun_rank_samples_total", "counter",
     "Samples processed in this round (absent when the batch size is unknown).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->samples_total >= 0) out.Add(s.rank->samples_total);
     }},
    {"ddprun_rank_step_seconds", "summary",
     "Step time: median and 90th percentile over the last 100 steps; sum and count over the "
     "round.",
     Scope::kRank,
     [](const Subject& s, Samples& out) {
       const RankView& r = *s.rank;
       if (r.step_p50_s >= 0) {
         out.Add("quantile=\"0.5\"", r.step_p50_s);
         out.Add("quantile=\"0.9\"", r.step_p90_s);
       }
       out.AddSuffixed("_sum", r.step_seconds_sum);
       out.AddSuffixed("_count", static_cast<double>(r.step_count));
     }},
    {"ddprun_rank_steps_per_second", "gauge", "Steps per second over the last 10 s.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->steps_per_s); }},
    {"ddprun_rank_samples_per_second", "gauge",
     "Samples per second over the last 10 s (absent when unknown).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->samples_per_s >= 0) out.Add(s.rank->samples_per_s);
     }},
    {"ddprun_rank_cpu_ratio", "gauge",
     "CPU time of the worker per second of wall time (1 = one core busy).", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->cpu_percent / 100.0); }},
    {"ddprun_rank_resident_memory_bytes", "gauge", "Resident set size of the worker.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.rank->rss_bytes)); }},
    {"ddprun_rank_checkpoint_step", "gauge",
     "Newest step committed to the worker's checkpoint memory (absent before its first save).",
     Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->has_checkpoint) out.Add(static_cast<double>(s.rank->checkpoint_step));
     }},
    {"ddprun_rank_checkpoint_bytes", "gauge",
     "Size of the worker's newest committed checkpoint (absent before its first save).",
     Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->has_checkpoint) out.Add(static_cast<double>(s.rank->checkpoint_bytes));
     }},
    {"ddprun_rank_checkpoint_memory_bytes", "gauge",
     "Memory the worker's checkpoint memory holds now (both slots' pages in use).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       out.Add(static_cast<double>(s.rank->checkpoint_memory_bytes));
     }},
    {"ddprun_rank_gpu_utilization_ratio", "gauge",
     "GPU utilisation from NVML, 0..1 (absent without a GPU).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->gpu_util_percent >= 0) out.Add(s.rank->gpu_util_percent / 100.0);
     }},
    {"ddprun_rank_gpu_memory_used_bytes", "gauge",
     "GPU memory used by the worker (absent without a GPU).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->gpu_util_percent >= 0) out.Add(static_cast<double>(s.rank->gpu_mem_bytes));
     }},
    {"ddprun_rank_straggler", "gauge",
     "1 when the rank's median step time is at least 30% above the fastest rank's.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->straggler ? 1 : 0); }},
    {"ddprun_rank_straggler_gap_seconds", "gauge",
     "Median step time (without time in collectives) minus the fastest rank's.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->straggler_gap_s); }},
    {"ddprun_rank_collectives_started_total", "counter",
     "SDK collectives started in this round (0 without the SDK).", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(static_cast<double>(s.rank->collective_seq)); }},
    {"ddprun_rank_communication_seconds_total", "counter",
     "Time spent inside SDK collectives in this round.", Scope::kRank,
     [](const Subject& s, Samples& out) { out.Add(s.rank->comm_seconds_total); }},
    {"ddprun_rank_collective_calls_total", "counter", "SDK collective calls per operation.",
     Scope::kRank,
     [](const Subject& s, Samples& out) {
       PerOp(*s.rank, out, [](const CollectiveStat& c) { return static_cast<double>(c.count); });
     }},
    {"ddprun_rank_collective_bytes_total", "counter",
     "Payload bytes per rank of SDK collectives per operation.", Scope::kRank,
     [](const Subject& s, Samples& out) {
       PerOp(*s.rank, out,
             [](const CollectiveStat& c) { return static_cast<double>(c.bytes_total); });
     }},
    {"ddprun_rank_collective_seconds_total", "counter",
     "Time inside SDK collectives per operation.", Scope::kRank,
     [](const Subject& s, Samples& out) {
       PerOp(*s.rank, out, [](const CollectiveStat& c) { return c.seconds_total; });
     }},
    {"ddprun_rank_collective_busbw_bytes_per_second", "gauge",
     "Bus bandwidth of the latest call per operation (nccl-tests' definition).", Scope::kRank,
     [](const Subject& s, Samples& out) {
       PerOp(*s.rank, out, [](const CollectiveStat& c) { return c.busbw_gbps * 1e9; });
     }},
    {"ddprun_rank_scalar", "gauge",
     "Named scalars the trainer reports (loss, learning rate, ...); the name is a label.",
     Scope::kRank,
     [](const Subject& s, Samples& out) {
       for (const auto& [k, v] : s.rank->scalars) out.Add(Label("name", k), v);
     }},
    {"ddprun_rank_data_age_seconds", "gauge",
     "Seconds since this server received the rank's latest data.", Scope::kRank,
     [](const Subject& s, Samples& out) {
       if (s.rank->age_s >= 0) out.Add(s.rank->age_s);
     }},
};

// # HELP and # TYPE of a family; its help is our own text (no backslash or
// newline to escape).
void Header(const Family& f, std::string* out) {
  *out += "# HELP ";
  *out += f.name;
  *out += ' ';
  *out += f.help;
  *out += "\n# TYPE ";
  *out += f.name;
  *out += ' ';
  *out += f.type;
  *out += '\n';
}

}  // namespace

std::string PrometheusText(const std::vector<JobView>& views, const HubCounters& counters) {
  std::string out;
  out.reserve(4096 + views.size() * 1024);
  const std::string no_labels;
  for (const Family& f : kFamilies) {
    Header(f, &out);
    switch (f.scope) {
      case Scope::kServer: {
        Samples samples(&out, f.name, no_labels);
        f.samples(Subject{counters}, samples);
        break;
      }
      case Scope::kJob:
        for (const auto& j : views) {
          const std::string labels = JobLabels(j);
          Samples samples(&out, f.name, labels);
          f.samples(Subject{counters, &j}, samples);
        }
        break;
      case Scope::kRank:
        for (const auto& j : views) {
          if (j.state != JobState::kRunning) continue;
          for (const auto& r : j.ranks) {
            const std::string labels = RankLabels(j, r);
            Samples samples(&out, f.name, labels);
            f.samples(Subject{counters, &j, &r}, samples);
          }
        }
        break;
    }
  }
  return out;
}

}  // namespace ddprun::rendezvous
