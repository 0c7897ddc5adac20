// The renderers' output, byte for byte, for a simulated daemon (FakeClock,
// the real JobTable and MetricsHub): /metrics (PrometheusText), the job
// document (JobViewJson) and the job list (JobListJson) against the files in
// golden/. The jobs cover every branch the renderers take: a running job
// with a published hang, GPU, collectives, scalars whose names need escaping,
// a recovery budget from two nodes and a rank that exited; a failed job; a job without a progress
// source whose rank sent an unknown state; a job still gathering.
//
// DDPRUN_UPDATE_GOLDEN=1 rewrites the files from the current output (only for
// a deliberate change of the formats; review the diff).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/hang_action.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/rendezvous/monitoring/metrics_json.h"
#include "ddprun/rendezvous/monitoring/prometheus_text.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

class NullSink final : public EventSink {
 public:
  void Bind(const std::string&, const std::string&) override {}
  void Deliver(RoundEvent) override {}
};

struct Daemon {
  Daemon() {
    MetricsHubOptions ho;
    ho.clock = &clock;
    ho.unix_at_start = 1700000000;
    ho.act = [this](const std::string& job, std::int64_t round, const std::string& node,
                    OnHang action, const WorkerFailure& f) {
      (void)ApplyOnHang(*table, job, round, node, action, f);
    };
    hub = std::make_unique<MetricsHub>(std::move(ho));
    JobTableOptions to;
    to.clock = &clock;
    to.observer = hub.get();
    table = std::make_unique<JobTable>(std::move(to));
  }

  // Joins `nodes` nodes of `nproc` ranks each to `job` (of `min_nodes`).
  void Join(const std::string& job, int nodes, int nproc, int min_nodes) {
    for (int i = 0; i < nodes; ++i) {
      JoinSpec s;
      s.job_id = job;
      s.host = job + "-host" + std::to_string(i);
      s.pid = 100 + i;
      s.nproc = nproc;
      s.min_nodes = s.max_nodes = min_nodes;
      s.policy.hang_timeout_s = 10;
      s.policy.on_hang = OnHang::kReport;
      s.requested_rank = i;
      auto id = table->Join(s, std::make_shared<NullSink>());
      REQUIRE(id.ok());
      node_ids[job].push_back(*id);
    }
  }

  FakeClock clock;
  std::unique_ptr<MetricsHub> hub;
  std::unique_ptr<JobTable> table;
  std::map<std::string, std::vector<std::string>> node_ids;
};

// Node n of job "train": ranks 2n, 2n+1; rank 2 stops at step 12.
MetricsReport TrainReport(Daemon& d, int n, std::int64_t steps, std::int64_t prev) {
  MetricsReport r;
  r.job_id = "train";
  r.node_id = d.node_ids["train"][n];
  r.host = "train-host" + std::to_string(n);
  r.unix_s = 1700000000.5 + static_cast<double>(steps);
  for (int l = 0; l < 2; ++l) {
    RankSample s;
    s.rank = 2 * n + l;
    s.local_rank = l;
    s.pid = 500 + s.rank;
    s.state = "running";
    s.has_progress_source = true;
    s.steps = s.rank == 2 ? std::min<std::int64_t>(steps, 12) : steps;
    for (std::int64_t i = prev; i < s.steps; ++i) {
      s.step_seconds.push_back(0.1 + 0.01 * s.rank + 0.001 * static_cast<double>(i % 3));
    }
    if (s.rank != 1) s.samples_total = 32.0 * static_cast<double>(s.steps);
    s.collective_seq = 3 * s.steps;
    s.in_collective = s.rank != 2;
    s.collective_op = s.rank != 2 ? "allreduce" : "";
    s.comm_seconds_total = 0.02 * static_cast<double>(s.steps);
    if (s.rank == 0) {
      s.collectives.push_back({"allreduce", 2 * s.steps, 4096 * s.steps, 0.015, 12.5});
      s.collectives.push_back({"broadcast", 1, 1024, 0.001, 0.25});
      s.scalars["loss"] = 1.25;
      s.scalars["lr \"warm\\up\"\nx"] = 0.001;
      s.gpu_util_percent = 87.5;
      s.gpu_mem_bytes = 3ull << 30;
    }
    s.cpu_percent = 95 + s.rank;
    s.rss_bytes = (1ull << 30) + static_cast<std::uint64_t>(s.rank);
    // Rank 3 has checkpoint memory but has not saved yet (no step, no bytes).
    s.has_checkpoint = s.rank != 3;
    if (s.has_checkpoint) {
      s.checkpoint_step = s.steps - s.steps % 5;
      s.checkpoint_bytes = (1ull << 20) + static_cast<std::uint64_t>(s.rank);
    }
    s.checkpoint_memory_bytes = s.rank == 3 ? 4096 : (2ull << 20) + 4096;
    r.ranks.push_back(s);
  }
  if (n == 0) r.events.push_back("worker 1 \"started\"");
  return r;
}

std::string Golden(const std::string& name) {
  return std::string(DDPRUN_SOURCE_DIR) + "/tests/unit/rendezvous/monitoring/golden/" + name;
}

void CheckGolden(const std::string& name, const std::string& actual) {
  if (const char* u = std::getenv("DDPRUN_UPDATE_GOLDEN"); u != nullptr && std::string(u) == "1") {
    std::ofstream(Golden(name), std::ios::binary) << actual;
  }
  std::ifstream in(Golden(name), std::ios::binary);
  REQUIRE(in.good());
  std::stringstream expected;
  expected << in.rdbuf();
  INFO("golden/" << name << " (DDPRUN_UPDATE_GOLDEN=1 rewrites it)");
  CHECK(actual == expected.str());
}

TEST_CASE("/metrics and the JSON documents are byte-for-byte the golden files",
          "[metrics][golden]") {
  Daemon d;
  // "train": two nodes of two ranks; rank 2 stops, the hang is published.
  d.Join("train", 2, 2, 2);
  for (int t = 0; t <= 40; ++t) {
    d.clock.Advance(1s);
    for (int n = 0; n < 2; ++n) {
      const std::int64_t steps = std::min(t, 15);
      REQUIRE(d.hub->Report(TrainReport(d, n, steps, t == 0 ? 0 : std::min(t - 1, 15))).ok());
    }
    d.hub->Tick();
  }
  // Both nodes report the round's recovery budget (docs/recovery.md): the
  // job's is each phase's slowest node, the cause the one naming a worker.
  for (int n = 0; n < 2; ++n) {
    MetricsReport rr = TrainReport(d, n, 15, 15);
    RecoveryBudget b;
    b.outcome = "recovered";
    b.cause = n == 0 ? "restarted: a worker failed on train-host1"
                     : "worker rank 3 exited with signal SIGKILL";
    b.stopped_ms = n == 0 ? 10 : 12.5;
    b.round_ms = n == 0 ? 20 : 18;
    b.started_ms = n == 0 ? 30 : 40;
    b.first_step_ms = n == 0 ? 1000 : 900;
    rr.recovery = b;
    REQUIRE(d.hub->Report(rr).ok());
  }
  // Rank 3 exits; the view keeps it.
  MetricsReport exited = TrainReport(d, 1, 15, 15);
  exited.ranks[1].state = "exited";
  REQUIRE(d.hub->Report(exited).ok());
  // "broken": one node, its round fails.
  d.Join("broken", 1, 1, 1);
  d.clock.Advance(500ms);
  REQUIRE(d.table->Abort("broken", 0, "rank 0 \"exploded\"", {}).ok());
  // "quiet": no progress source, so no hang detection.
  d.Join("quiet", 1, 1, 1);
  d.clock.Advance(1s);
  MetricsReport q;
  q.job_id = "quiet";
  q.node_id = d.node_ids["quiet"][0];
  q.host = "quiet-host0";
  q.unix_s = 1700000100;
  q.ranks.push_back({});
  q.ranks[0].rank = 0;
  q.ranks[0].local_rank = 0;
  q.ranks[0].pid = 900;
  q.ranks[0].state = "bogus";
  REQUIRE(d.hub->Report(q).ok());
  // "waiting": one of two nodes joined.
  d.Join("waiting", 1, 1, 2);
  d.clock.Advance(250ms);
  d.hub->Tick();

  const std::vector<JobView> views = d.hub->Views(/*with_history=*/false);
  REQUIRE(views.size() == 4);
  CheckGolden("metrics.prom", PrometheusText(views, d.hub->counters()));
  CheckGolden("jobs.json", JobListJson(views));
  for (const char* job : {"train", "broken", "quiet", "waiting"}) {
    auto v = d.hub->View(job);
    REQUIRE(v.ok());
    CheckGolden(std::string("job_") + job + ".json", JobViewJson(*v));
  }
}

}  // namespace
}  // namespace ddprun::rendezvous
