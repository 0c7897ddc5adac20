#include "ddprun/rendezvous/monitoring/prometheus_text.h"

#include <cmath>
#include <cstdio>
#include <functional>

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

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void Family(const char* name, const char* type, const char* help) {
    *out_ += "# HELP ";
    *out_ += name;
    *out_ += ' ';
    *out_ += help;  // our own text: no backslash or newline
    *out_ += "\n# TYPE ";
    *out_ += name;
    *out_ += ' ';
    *out_ += type;
    *out_ += '\n';
  }
  void Sample(const std::string& name, const std::string& labels, double v) {
    *out_ += name;
    if (!labels.empty()) {
      *out_ += '{';
      *out_ += labels;
      *out_ += '}';
    }
    *out_ += ' ';
    *out_ += Num(v);
    *out_ += '\n';
  }

 private:
  std::string* out_;
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

std::string PrometheusText(const std::vector<JobView>& views, const HubCounters& counters) {
  std::string out;
  out.reserve(4096 + views.size() * 1024);
  Writer w(&out);
  w.Family("ddprun_metrics_reports_total", "counter",
           "Metrics reports accepted from agents by this server.");
  w.Sample("ddprun_metrics_reports_total", "", static_cast<double>(counters.reports));
  w.Family("ddprun_metrics_reports_rejected_total", "counter",
           "Metrics reports refused (unknown job, stale round, not a member).");
  w.Sample("ddprun_metrics_reports_rejected_total", "",
           static_cast<double>(counters.reports_rejected));

  using JobFn = std::function<void(const JobView&)>;
  auto per_job = [&](const char* name, const char* type, const char* help, const JobFn& fn) {
    w.Family(name, type, help);
    for (const auto& j : views) fn(j);
  };
  per_job("ddprun_job_info", "gauge", "1 for every job; its state is a label.",
          [&](const JobView& j) {
            w.Sample("ddprun_job_info", JobLabels(j) + "," + Label("state", Name(j.state)), 1);
          });
  per_job("ddprun_job_world_size", "gauge", "Workers (ranks) in the job's current round.",
          [&](const JobView& j) { w.Sample("ddprun_job_world_size", JobLabels(j), j.world_size); });
  per_job("ddprun_job_restarts_total", "counter", "Failure restarts of the job so far.",
          [&](const JobView& j) {
            w.Sample("ddprun_job_restarts_total", JobLabels(j), j.restart_count);
          });
  per_job("ddprun_job_samples_per_second", "gauge",
          "Samples per second of all ranks together (absent when no rank knows its batch size).",
          [&](const JobView& j) {
            if (j.samples_per_s >= 0)
              w.Sample("ddprun_job_samples_per_second", JobLabels(j), j.samples_per_s);
          });
  per_job("ddprun_job_steps_per_second", "gauge", "Mean steps per second over the ranks.",
          [&](const JobView& j) {
            w.Sample("ddprun_job_steps_per_second", JobLabels(j), j.steps_per_s);
          });
  per_job("ddprun_job_step_time_seconds", "gauge",
          "The slowest rank's median step time (the job's pace).", [&](const JobView& j) {
            if (j.step_time_s >= 0)
              w.Sample("ddprun_job_step_time_seconds", JobLabels(j), j.step_time_s);
          });
  per_job("ddprun_job_hangs_total", "counter", "Hang reports published for the job.",
          [&](const JobView& j) {
            w.Sample("ddprun_job_hangs_total", JobLabels(j), static_cast<double>(j.hangs));
          });
  per_job("ddprun_job_hung", "gauge", "1 while a hang is being captured or reported.",
          [&](const JobView& j) {
            w.Sample("ddprun_job_hung", JobLabels(j),
                     j.hang_state == HangState::kCapturing || j.hang_state == HangState::kReported
                         ? 1
                         : 0);
          });
  per_job("ddprun_job_data_age_seconds", "gauge",
          "Age of the oldest rank's latest data on this server.", [&](const JobView& j) {
            if (j.data_age_s >= 0)
              w.Sample("ddprun_job_data_age_seconds", JobLabels(j), j.data_age_s);
          });

  using RankFn = std::function<void(const JobView&, const RankView&, const std::string&)>;
  auto per_rank = [&](const char* name, const char* type, const char* help, const RankFn& fn) {
    w.Family(name, type, help);
    for (const auto& j : views) {
      if (j.state != JobState::kRunning) continue;
      for (const auto& r : j.ranks) fn(j, r, RankLabels(j, r));
    }
  };
  per_rank("ddprun_rank_running", "gauge", "1 while the worker runs, 0 otherwise.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_running", l, r.state == RankState::kRunning ? 1 : 0);
           });
  per_rank("ddprun_rank_steps_total", "counter", "Training steps completed in this round.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_steps_total", l, static_cast<double>(r.steps));
           });
  per_rank("ddprun_rank_samples_total", "counter",
           "Samples processed in this round (absent when the batch size is unknown).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.samples_total >= 0) w.Sample("ddprun_rank_samples_total", l, r.samples_total);
           });
  per_rank("ddprun_rank_step_seconds", "summary",
           "Step time: median and 90th percentile over the last 100 steps; sum and count over the "
           "round.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.step_p50_s >= 0) {
               w.Sample("ddprun_rank_step_seconds", l + ",quantile=\"0.5\"", r.step_p50_s);
               w.Sample("ddprun_rank_step_seconds", l + ",quantile=\"0.9\"", r.step_p90_s);
             }
             w.Sample("ddprun_rank_step_seconds_sum", l, r.step_seconds_sum);
             w.Sample("ddprun_rank_step_seconds_count", l, static_cast<double>(r.step_count));
           });
  per_rank("ddprun_rank_steps_per_second", "gauge", "Steps per second over the last 10 s.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_steps_per_second", l, r.steps_per_s);
           });
  per_rank("ddprun_rank_samples_per_second", "gauge",
           "Samples per second over the last 10 s (absent when unknown).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.samples_per_s >= 0)
               w.Sample("ddprun_rank_samples_per_second", l, r.samples_per_s);
           });
  per_rank("ddprun_rank_cpu_ratio", "gauge",
           "CPU time of the worker per second of wall time (1 = one core busy).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_cpu_ratio", l, r.cpu_percent / 100.0);
           });
  per_rank("ddprun_rank_resident_memory_bytes", "gauge", "Resident set size of the worker.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_resident_memory_bytes", l, static_cast<double>(r.rss_bytes));
           });
  per_rank("ddprun_rank_gpu_utilization_ratio", "gauge",
           "GPU utilisation from NVML, 0..1 (absent without a GPU).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.gpu_util_percent >= 0)
               w.Sample("ddprun_rank_gpu_utilization_ratio", l, r.gpu_util_percent / 100.0);
           });
  per_rank("ddprun_rank_gpu_memory_used_bytes", "gauge",
           "GPU memory used by the worker (absent without a GPU).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.gpu_util_percent >= 0)
               w.Sample("ddprun_rank_gpu_memory_used_bytes", l,
                        static_cast<double>(r.gpu_mem_bytes));
           });
  per_rank("ddprun_rank_straggler", "gauge",
           "1 when the rank's median step time is at least 30% above the fastest rank's.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_straggler", l, r.straggler ? 1 : 0);
           });
  per_rank("ddprun_rank_straggler_gap_seconds", "gauge",
           "Median step time (without time in collectives) minus the fastest rank's.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_straggler_gap_seconds", l, r.straggler_gap_s);
           });
  per_rank("ddprun_rank_collectives_started_total", "counter",
           "SDK collectives started in this round (0 without the SDK).",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_collectives_started_total", l,
                      static_cast<double>(r.collective_seq));
           });
  per_rank("ddprun_rank_communication_seconds_total", "counter",
           "Time spent inside SDK collectives in this round.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             w.Sample("ddprun_rank_communication_seconds_total", l, r.comm_seconds_total);
           });
  auto per_op = [&](const char* name, const char* type, const char* help,
                    std::function<double(const CollectiveStat&)> get) {
    per_rank(name, type, help, [&](const JobView&, const RankView& r, const std::string& l) {
      for (const auto& c : r.collectives) w.Sample(name, l + "," + Label("op", c.op), get(c));
    });
  };
  per_op("ddprun_rank_collective_calls_total", "counter", "SDK collective calls per operation.",
         [](const CollectiveStat& c) { return static_cast<double>(c.count); });
  per_op("ddprun_rank_collective_bytes_total", "counter",
         "Payload bytes per rank of SDK collectives per operation.",
         [](const CollectiveStat& c) { return static_cast<double>(c.bytes_total); });
  per_op("ddprun_rank_collective_seconds_total", "counter",
         "Time inside SDK collectives per operation.",
         [](const CollectiveStat& c) { return c.seconds_total; });
  per_op("ddprun_rank_collective_busbw_bytes_per_second", "gauge",
         "Bus bandwidth of the latest call per operation (nccl-tests' definition).",
         [](const CollectiveStat& c) { return c.busbw_gbps * 1e9; });
  per_rank("ddprun_rank_scalar", "gauge",
           "Named scalars the trainer reports (loss, learning rate, ...); the name is a label.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             for (const auto& [k, v] : r.scalars)
               w.Sample("ddprun_rank_scalar", l + "," + Label("name", k), v);
           });
  per_rank("ddprun_rank_data_age_seconds", "gauge",
           "Seconds since this server received the rank's latest data.",
           [&](const JobView&, const RankView& r, const std::string& l) {
             if (r.age_s >= 0) w.Sample("ddprun_rank_data_age_seconds", l, r.age_s);
           });
  return out;
}

}  // namespace ddprun::rendezvous
