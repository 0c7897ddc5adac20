// The recovery budget end to end (docs/recovery.md): a real PyTorch DDP job
// (gloo) whose rank 1 is SIGKILLed restarts once; the agent's console line
// gives each phase in milliseconds from the failure, present, ordered and
// non-negative, and the dashboard's JSON API and /metrics carry the same
// restart's budget (read by the restarted rank 0 while the job runs).
#include <catch2/catch.hpp>
#include <regex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;
using nlohmann::json;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here
const std::string kScript = std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/recover_ddp.py";

bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

// The value of `name{...,phase="<phase>"}` in a /metrics text; -1 if absent.
double PhaseSeconds(const std::string& metrics, const std::string& phase) {
  std::smatch m;
  const std::regex re("ddprun_job_recovery_seconds\\{[^}]*phase=\"" + phase +
                      "\"[^}]*\\} ([0-9.eE+-]+)");
  return std::regex_search(metrics, m, re) ? std::stod(m[1]) : -1;
}

}  // namespace

TEST_CASE(
    "recovery budget: a SIGKILLed rank of a PyTorch DDP job gives one console line with "
    "ordered phases, and the JSON API and /metrics carry them",
    "[e2e][recovery]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  // In ddprun's own rendezvous (the report reaches the hub in process), and
  // through ddprund (over gRPC: MetricsReport.recovery).
  const bool daemon = GENERATE(false, true);
  INFO((daemon ? "through ddprund" : "ddprun's own rendezvous"));
  Harness h;
  const std::string out = h.MakeDir("out");
  std::vector<std::string> args{"--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=budget1"};
  int port = 0;
  if (daemon) {
    Proc* d = nullptr;
    const int rdzv = h.StartDaemon("ddprund", &d);
    port = DashboardPort(*d);
    args.push_back("--rdzv_endpoint=127.0.0.1:" + std::to_string(rdzv));
  } else {
    port = FreePort();
    args.push_back("--dashboard_port=" + std::to_string(port));
  }
  args.insert(args.end(), {kPython, kScript});
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  Proc& p = h.StartDdprun("ddprun", args, {{"BUDGET_URL", url}, {"OUT_DIR", out}});
  const int rc = h.Wait(p, 180);
  const std::string console = p.Out() + p.Err();
  INFO(console);
  REQUIRE(rc == 0);

  // One line for the one restart, fenced by the job and the new round.
  std::smatch m;
  const std::regex line(
      "ddprun: \\[job budget1 round ([0-9]+)\\] recovered in ([0-9]+) ms: detected \\+0, "
      "stopped \\+([0-9]+), round \\+([0-9]+), started \\+([0-9]+), first step \\+([0-9]+) "
      "\\(worker rank 1 ([^)]*)\\)");
  REQUIRE(std::regex_search(console, m, line));
  CHECK(std::stoi(m[1]) == 1);  // rounds count from 0
  const long stopped = std::stol(m[3]), round = std::stol(m[4]), started = std::stol(m[5]),
             first = std::stol(m[6]);
  CHECK(std::stol(m[2]) == first);
  CHECK(0 <= stopped);
  CHECK(stopped <= round);
  CHECK(round <= started);
  CHECK(started <= first);
  CHECK_THAT(std::string(m[7]), Catch::Contains("SIGKILL"));
  // Exactly one recovery line.
  const std::string rest = m.suffix();
  CHECK(rest.find("recovered in") == std::string::npos);

  // The JSON API (read by the restarted rank 0): the same budget.
  const json jobs = json::parse(ReadFile(out + "/jobs.json"));
  INFO(jobs.dump(1));
  json job;
  for (const json& j : jobs["jobs"])
    if (j["job_id"] == "budget1") job = j;
  REQUIRE(job.is_object());
  CHECK(job["recoveries"] == 1);
  const json& r = job["last_recovery"];
  REQUIRE(r.is_object());
  CHECK(r["round"].get<long>() == std::stol(m[1]));
  CHECK(r["stopped_ms"].get<double>() == Approx(stopped).margin(1));
  CHECK(r["round_ms"].get<double>() == Approx(round).margin(1));
  CHECK(r["started_ms"].get<double>() == Approx(started).margin(1));
  CHECK(r["first_step_ms"].get<double>() == Approx(first).margin(1));
  CHECK_THAT(r["cause"].get<std::string>(), Catch::Contains("worker rank 1"));

  // /metrics: the phases in seconds and the counter.
  const std::string metrics = ReadFile(out + "/metrics.txt");
  INFO(metrics);
  CHECK(PhaseSeconds(metrics, "stopped") == Approx(stopped / 1000.0).margin(0.001));
  CHECK(PhaseSeconds(metrics, "round") == Approx(round / 1000.0).margin(0.001));
  CHECK(PhaseSeconds(metrics, "started") == Approx(started / 1000.0).margin(0.001));
  CHECK(PhaseSeconds(metrics, "first_step") == Approx(first / 1000.0).margin(0.001));
  CHECK(std::regex_search(
      metrics, std::regex("ddprun_job_recoveries_total\\{[^}]*job=\"budget1\"[^}]*\\} 1")));
}
