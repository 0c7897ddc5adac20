// `ddprun top`: GetMetrics every second, rendered as a table.
#include "ddprun/launcher/client/top_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon_client.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher {
namespace {

using Json = nlohmann::json;

std::string Num(const Json& v, int digits) {
  if (!v.is_number()) return "n/a";
  return absl::StrFormat("%.*f", digits, v.get<double>());
}

std::string Mib(const Json& v) {
  if (!v.is_number()) return "n/a";
  return absl::StrFormat("%.0f", v.get<double>() / 1048576.0);
}

}  // namespace

std::string FormatTop(const std::string& job_json) {
  Json j = Json::parse(job_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ranks")) {
    return "ddprun top: the server sent a document that is not a job view\n";
  }
  std::string out = absl::StrFormat(
      "job %s  round %d  %s  world %d  nodes %d  restarts %d\n"
      "samples/s %s  steps/s %s  step time %s s  data age %s s  hang detection %s\n",
      j.value("job_id", ""), j.value("round", 0), j.value("state", ""), j.value("world_size", 0),
      j.value("nodes", 0), j.value("restart_count", 0), Num(j["samples_per_s"], 1),
      Num(j["steps_per_s"], 2), Num(j["step_time_s"], 4), Num(j["data_age_s"], 1),
      j.value("hang_state", ""));
  absl::StrAppendFormat(
      &out, "%5s %-16s %8s %-8s %8s %9s %9s %8s %10s %6s %7s %5s %7s %9s %7s %8s %s\n", "RANK",
      "HOST", "PID", "STATE", "STEPS", "P50_S", "P90_S", "STEPS/S", "SAMPLES/S", "CPU%", "RSS_MB",
      "GPU%", "GPU_MB", "CKPT_STEP", "CKPT_MB", "CKMEM_MB", "STRAGGLER");
  for (const auto& r : j["ranks"]) {
    std::string strag;
    if (r.value("straggler", false)) {
      strag = absl::StrFormat("* +%.4f s (x%.2f)", r.value("straggler_gap_s", 0.0),
                              r.value("slowdown", 0.0));
    }
    absl::StrAppendFormat(
        &out, "%5d %-16s %8d %-8s %8d %9s %9s %8s %10s %6s %7s %5s %7s %9s %7s %8s %s\n",
        r.value("rank", -1), r.value("host", "").substr(0, 16), r.value("pid", 0LL),
        r.value("state", ""), r.value("steps", 0LL), Num(r["step_p50_s"], 4),
        Num(r["step_p90_s"], 4), Num(r["steps_per_s"], 2), Num(r["samples_per_s"], 1),
        Num(r["cpu_percent"], 0), Mib(r["rss_bytes"]), Num(r["gpu_util_percent"], 0),
        Mib(r["gpu_mem_bytes"]), Num(r["checkpoint_step"], 0), Mib(r["checkpoint_bytes"]),
        Mib(r["checkpoint_memory_bytes"]), strag);
  }
  const std::string hang = j.value("hang_report", "");
  if (!hang.empty()) absl::StrAppend(&out, "\n", hang);
  if (j.value("state", "") == "failed" && j.contains("failure")) {
    absl::StrAppend(&out, "\nfailed: ", j["failure"].value("reason", ""), "\n");
  }
  return out;
}

int RunTopCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "ddprun top: live per-rank metrics of a job (steps, step time, samples/s, CPU, memory, "
      "GPU, stragglers, hangs), refreshed every second.",
      "ddprun top"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  DaemonClientFlags flags;
  std::string job_id;
  bool once = false;
  AddDaemonClientFlags(app, flags, "ddprund (or the agent hosting the rendezvous) to ask");
  app.add_option("--job,--rdzv_id,--rdzv-id", job_id,
                 "The job; optional when the daemon serves exactly one");
  app.add_flag("--once", once, "Print one snapshot and exit (for scripts)");
  if (auto done = ParseClientCommand(app, args, "top", out, err)) return *done;
  if (!job_id.empty()) {
    if (auto id = ParseJobIdValue(job_id); !id.ok()) {
      err << "ddprun top: --job " << id.status().message() << std::endl;
      return kExitUsage;
    }
  }
  auto daemon = ConnectToDaemon(flags);
  if (!daemon.ok()) {
    err << "ddprun top: " << daemon.status().message() << std::endl;
    return ExitCodeOf(daemon.status());
  }
  const rendezvous::HostPort* hp = &daemon->endpoint;
  const auto timeout = daemon->timeout;
  auto& client = daemon->client;
  if (job_id.empty()) {
    auto jobs = client->Status("", timeout);
    if (!jobs.ok()) {
      err << "ddprun top: " << jobs.status().message() << std::endl;
      return kExitRendezvousError;
    }
    if (jobs->size() != 1) {
      std::string ids;
      for (const auto& j : *jobs) absl::StrAppend(&ids, ids.empty() ? "" : ", ", j.job_id);
      err << "ddprun top: " << rendezvous::FormatHostPort(*hp) << " serves "
          << (jobs->empty() ? "no job" : absl::StrCat(jobs->size(), " jobs (", ids, ")"))
          << "; pass --job ID" << std::endl;
      return jobs->empty() ? kExitRendezvousError : kExitUsage;
    }
    job_id = jobs->front().job_id;
  }
  const bool tty = !once && &out == &std::cout && isatty(STDOUT_FILENO);
  std::string last_state;  // of the last document shown, "" before the first
  for (;;) {
    auto doc = client->GetMetrics(job_id, timeout);
    if (!doc.ok()) {
      if (absl::IsUnimplemented(doc.status())) {
        err << "ddprun top: the server at " << rendezvous::FormatHostPort(*hp)
            << " has no monitoring (an older ddprund); upgrade it" << std::endl;
        return kExitRendezvousError;
      }
      // The job was being watched and its rendezvous went away or forgot
      // it: a node hosting the rendezvous stops serving when its job ends.
      if (!last_state.empty() && !absl::IsDeadlineExceeded(doc.status())) {
        out << "ddprun top: job " << job_id << " ended (" << rendezvous::FormatHostPort(*hp)
            << " no longer serves it; its last state was " << last_state << ")" << std::endl;
        return kExitSuccess;
      }
      err << "ddprun top: " << doc.status().message() << std::endl;
      return kExitRendezvousError;
    }
    if (tty) out << "\033[H\033[2J";
    out << FormatTop(*doc);
    out.flush();
    if (once) return kExitSuccess;
    const Json j = Json::parse(*doc, nullptr, /*allow_exceptions=*/false);
    last_state = j.is_object() ? j.value("state", "unknown") : "unknown";
    if (last_state == "succeeded" || last_state == "failed" || last_state == "stopped") {
      out << "ddprun top: job " << job_id << " ended: " << last_state << std::endl;
      return kExitSuccess;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace ddprun::launcher
