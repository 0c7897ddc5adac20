#include "ddprun/rendezvous/monitoring/metrics_json.h"

#include "ddprun/rendezvous/monitoring/monitoring_states.h"
#include "nlohmann/json.hpp"

namespace ddprun::rendezvous {
namespace {

using Json = nlohmann::ordered_json;

// null for "unknown" (< 0).
Json Known(double v) { return v < 0 ? Json(nullptr) : Json(v); }

std::string Dump(const Json& j) {
  // Bytes that are not UTF-8 (a scalar name from a worker) become U+FFFD.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The last recovery's budget (docs/recovery.md); null before the first. A
// phase not reached is null.
Json Recovery(const std::optional<RecoveryBudget>& r) {
  if (!r) return nullptr;
  return {{"failed_round", r->failed_round},
          {"round", r->round},
          {"cause", r->cause},
          {"stopped_ms", Known(r->stopped_ms)},
          {"round_ms", Known(r->round_ms)},
          {"started_ms", Known(r->started_ms)},
          {"first_step_ms", Known(r->first_step_ms)}};
}

Json Summary(const JobView& v) {
  return {{"job_id", v.job_id},
          {"round", v.round},
          {"state", Name(v.state)},
          {"world_size", v.world_size},
          {"nodes", v.nodes},
          {"restart_count", v.restart_count},
          {"samples_per_s", Known(v.samples_per_s)},
          {"steps_per_s", v.steps_per_s},
          {"step_time_s", Known(v.step_time_s)},
          {"data_age_s", Known(v.data_age_s)},
          {"hang_timeout_s", v.hang_timeout_s},
          {"on_hang", v.on_hang},
          {"hang_state", Name(v.hang_state)},
          {"hangs", v.hangs},
          {"recoveries", v.recoveries},
          {"last_recovery", Recovery(v.last_recovery)}};
}

}  // namespace

std::string JobViewJson(const JobView& v) {
  Json j = Summary(v);
  j["now_unix_s"] = v.now_unix_s;
  j["hang_report"] = v.hang_report;
  Json ranks = Json::array();
  for (const auto& r : v.ranks) {
    Json colls = Json::array();
    for (const auto& c : r.collectives) {
      colls.push_back({{"op", c.op},
                       {"count", c.count},
                       {"bytes_total", c.bytes_total},
                       {"seconds_total", c.seconds_total},
                       {"busbw_gbps", c.busbw_gbps}});
    }
    Json scalars = Json::object();
    for (const auto& [k, x] : r.scalars) scalars[k] = x;
    ranks.push_back(
        {{"rank", r.rank},
         {"local_rank", r.local_rank},
         {"node_id", r.node_id},
         {"host", r.host},
         {"pid", r.pid},
         {"state", Name(r.state)},
         {"has_progress_source", r.has_progress_source},
         {"steps", r.steps},
         {"step_p50_s", Known(r.step_p50_s)},
         {"step_p90_s", Known(r.step_p90_s)},
         {"steps_per_s", r.steps_per_s},
         {"samples_per_s", Known(r.samples_per_s)},
         {"samples_total", Known(r.samples_total)},
         {"collective_seq", r.collective_seq},
         {"in_collective", r.in_collective},
         {"collective_op", r.collective_op},
         {"comm_seconds_total", r.comm_seconds_total},
         {"collectives", std::move(colls)},
         {"scalars", std::move(scalars)},
         {"scalars_dropped", r.scalars_dropped},
         {"cpu_percent", r.cpu_percent},
         {"rss_bytes", r.rss_bytes},
         {"gpu_util_percent", Known(r.gpu_util_percent)},
         {"gpu_mem_bytes", r.gpu_util_percent < 0 ? Json(nullptr) : Json(r.gpu_mem_bytes)},
         {"checkpoint_step", r.has_checkpoint ? Json(r.checkpoint_step) : Json(nullptr)},
         {"checkpoint_bytes", r.has_checkpoint ? Json(r.checkpoint_bytes) : Json(nullptr)},
         {"checkpoint_memory_bytes", r.checkpoint_memory_bytes},
         {"straggler", r.straggler},
         {"straggler_gap_s", r.straggler_gap_s},
         {"slowdown", r.slowdown},
         {"report_unix_s", r.report_unix_s},
         {"age_s", Known(r.age_s)},
         {"anomalies", r.anomalies}});
  }
  j["ranks"] = std::move(ranks);
  Json series = Json::array();
  for (const auto& p : v.series) {
    series.push_back({p.unix_s, Known(p.samples_per_s), p.steps_per_s, Known(p.step_time_s)});
  }
  j["series_columns"] = {"unix_s", "samples_per_s", "steps_per_s", "step_time_s"};
  j["series"] = std::move(series);
  Json events = Json::array();
  for (const auto& e : v.events) {
    events.push_back(
        {{"unix_s", e.unix_s}, {"round", e.round}, {"kind", e.kind}, {"text", e.text}});
  }
  j["events"] = std::move(events);
  Json failures = Json::array();
  for (const auto& f : v.failures) {
    failures.push_back({{"host", f.host},
                        {"rank", f.global_rank},
                        {"local_rank", f.local_rank},
                        {"exit_code", f.exit_code},
                        {"signal", f.signal},
                        {"pid", f.pid},
                        {"round", f.round},
                        {"unix_s", f.timestamp},
                        {"error_message", f.error_message},
                        {"stderr_tail", f.stderr_tail},
                        {"log_file", f.log_file}});
  }
  j["failure"] = {{"reason", v.close_reason}, {"failures", std::move(failures)}};
  return Dump(j);
}

std::string JobListJson(const std::vector<JobView>& views) {
  Json jobs = Json::array();
  for (const auto& v : views) jobs.push_back(Summary(v));
  return Dump(Json{{"jobs", std::move(jobs)}});
}

std::string ErrorJson(const std::string& message) { return Dump(Json{{"error", message}}); }

}  // namespace ddprun::rendezvous
