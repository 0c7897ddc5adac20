// The metrics hub over the real JobTable in simulated time (FakeClock):
// validation of reports, per-rank statistics, stragglers, the time series,
// and hang detection with each --on_hang. No sockets, no threads, no sleeping.
#include "ddprun/rendezvous/monitoring/metrics_hub.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/hang_action.h"
#include "ddprun/rendezvous/monitoring/hang_report.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

class RecordingSink final : public EventSink {
 public:
  void Bind(const std::string&, const std::string&) override {}
  void Deliver(RoundEvent event) override { events.push_back(std::move(event)); }
  std::vector<RoundEvent> events;
};

// Two nodes of two ranks each, running round 0, the hub observing the table.
struct Fixture {
  explicit Fixture(double hang_timeout_s = 0, std::string on_hang = "report",
                   int max_restarts = 3) {
    MetricsHubOptions ho;
    ho.clock = &clock;
    ho.unix_at_start = 1000;
    ho.log = [this](const std::string& line) { logged.push_back(line); };
    ho.act = [this](const std::string& job, std::int64_t round, const std::string& node,
                    OnHang action, const WorkerFailure& f) {
      acted = ApplyOnHang(*table, job, round, node, action, f);
    };
    hub = std::make_unique<MetricsHub>(std::move(ho));
    JobTableOptions to;
    to.clock = &clock;
    to.observer = hub.get();
    table = std::make_unique<JobTable>(std::move(to));
    for (int i = 0; i < 2; ++i) {
      JoinSpec s;
      s.job_id = "job1";
      s.host = "host" + std::to_string(i);
      s.pid = 100 + i;
      s.nproc = 2;
      s.min_nodes = s.max_nodes = 2;
      s.policy.max_restarts = max_restarts;
      s.policy.hang_timeout_s = hang_timeout_s;
      s.policy.on_hang = *ParseOnHang(on_hang);
      s.requested_rank = i;
      sinks.push_back(std::make_shared<RecordingSink>());
      auto id = table->Join(s, sinks.back());
      REQUIRE(id.ok());
      node_ids.push_back(*id);
    }
  }

  // Node n's report: its two ranks at `steps` (each step `step_s` long).
  MetricsReport Report(int n, std::int64_t steps, double step_s, std::int64_t prev_steps) {
    MetricsReport r;
    r.job_id = "job1";
    r.node_id = node_ids[n];
    r.round = round;
    r.host = "host" + std::to_string(n);
    r.unix_s = 1000;
    for (int l = 0; l < 2; ++l) {
      RankSample s;
      s.rank = 2 * n + l;
      s.local_rank = l;
      s.pid = 500 + s.rank;
      s.state = "running";
      s.has_progress_source = true;
      s.steps = steps;
      for (std::int64_t i = prev_steps; i < steps; ++i) s.step_seconds.push_back(step_s);
      s.samples_total = 32.0 * static_cast<double>(steps);
      s.cpu_percent = 95;
      s.rss_bytes = 1 << 30;
      r.ranks.push_back(s);
    }
    return r;
  }

  FakeClock clock;
  std::unique_ptr<MetricsHub> hub;
  std::unique_ptr<JobTable> table;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<std::string> node_ids;
  std::vector<std::string> logged;
  absl::Status acted = absl::UnknownError("not acted");
  std::int64_t round = 0;
};

const RankView& RankOf(const JobView& v, int rank) {
  for (const auto& r : v.ranks)
    if (r.rank == rank) return r;
  FAIL("no rank " << rank);
  return v.ranks.front();
}

TEST_CASE("metrics hub refuses reports of unknown jobs, stale rounds and strangers", "[metrics]") {
  Fixture f;
  MetricsReport r = f.Report(0, 1, 0.1, 0);
  r.job_id = "nosuchjob";
  CHECK(KindOf(f.hub->Report(r).status()) == ErrorKind::kState);
  r = f.Report(0, 1, 0.1, 0);
  r.round = 7;
  auto st = f.hub->Report(r).status();
  CHECK(KindOf(st) == ErrorKind::kState);
  CHECK_THAT(std::string(st.message()), Catch::Contains("[job job1 round 7]"));
  r = f.Report(0, 1, 0.1, 0);
  r.node_id = "stranger:1";
  CHECK(KindOf(f.hub->Report(r).status()) == ErrorKind::kState);
  r = f.Report(0, 1, 0.1, 0);
  r.job_id = std::string(5000, 'x');
  CHECK(KindOf(f.hub->Report(r).status()) == ErrorKind::kBadInput);
  CHECK(f.hub->counters().reports_rejected == 4);
  CHECK(f.hub->Report(f.Report(0, 1, 0.1, 0)).ok());
  // A rank of another node in this node's report is ignored.
  r = f.Report(0, 2, 0.1, 1);
  r.ranks[0].rank = 3;
  REQUIRE(f.hub->Report(r).ok());
  auto v = f.hub->View("job1");
  REQUIRE(v.ok());
  CHECK(RankOf(*v, 3).state == RankState::kUnknown);
  CHECK(absl::IsNotFound(f.hub->View("nope").status()));
}

TEST_CASE("metrics hub: ranks not heard from yet are in the view with their place", "[metrics]") {
  Fixture f;
  // Node 1 reports, node 0 has not yet: its ranks show their node and host.
  REQUIRE(f.hub->Report(f.Report(1, 10, 0.1, 0)).ok());
  auto v = f.hub->View("job1");
  REQUIRE(v.ok());
  REQUIRE(v->ranks.size() == 4);
  for (int rank = 0; rank < 4; ++rank) CHECK(v->ranks[rank].rank == rank);  // rank order
  const RankView& quiet = RankOf(*v, 1);
  CHECK(quiet.local_rank == 1);
  CHECK(quiet.node_id == f.node_ids[0]);
  CHECK(quiet.host == "host0");
  CHECK(quiet.state == RankState::kUnknown);
  CHECK(quiet.age_s == -1);
  CHECK(quiet.steps_per_s == 0);
  CHECK(quiet.samples_per_s == -1);
  const RankView& heard = RankOf(*v, 3);
  CHECK(heard.node_id == f.node_ids[1]);
  CHECK(heard.steps == 10);
  CHECK(heard.pid == 503);
}

TEST_CASE("metrics hub computes per-rank step times, rates and job totals", "[metrics]") {
  Fixture f;
  std::int64_t steps = 0;
  for (int t = 0; t < 30; ++t) {
    f.clock.Advance(1s);
    for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(f.Report(n, steps + 10, 0.1, steps)).ok());
    steps += 10;
    f.hub->Tick();
  }
  auto v = f.hub->View("job1");
  REQUIRE(v.ok());
  CHECK(v->state == JobState::kRunning);
  CHECK(v->world_size == 4);
  REQUIRE(v->ranks.size() == 4);
  const RankView& r = RankOf(*v, 1);
  CHECK(r.steps == 300);
  CHECK(r.step_p50_s == Approx(0.1));
  CHECK(r.step_p90_s == Approx(0.1));
  CHECK(r.steps_per_s == Approx(10).epsilon(0.01));
  CHECK(r.samples_per_s == Approx(320).epsilon(0.01));
  CHECK(r.host == "host0");
  CHECK(r.pid == 501);
  CHECK(!r.straggler);
  CHECK(v->samples_per_s == Approx(1280).epsilon(0.01));
  CHECK(v->step_time_s == Approx(0.1));
  CHECK(v->data_age_s == Approx(0).margin(1e-9));
  CHECK(v->series.size() >= 14);
  CHECK(v->events.front().kind == "join");
  bool round_event = false;
  for (const auto& e : v->events) round_event |= e.kind == "round";
  CHECK(round_event);
}

TEST_CASE("metrics hub clamps and drops bad values instead of failing", "[metrics]") {
  Fixture f;
  REQUIRE(f.hub->Report(f.Report(0, 50, 0.1, 40)).ok());
  MetricsReport r = f.Report(0, 10, 0.1, 0);  // steps going backwards
  RankSample& s = r.ranks[0];
  s.cpu_percent = std::nan("");
  s.gpu_util_percent = 1e300;
  s.samples_total = -std::numeric_limits<double>::infinity();
  s.step_seconds = {std::nan(""), -1, 1e300};
  s.state = "dancing";
  s.collective_op = std::string(10000, 'c');
  for (int i = 0; i < 5000; ++i) s.scalars["s" + std::to_string(i)] = i;
  s.scalars[std::string(100000, 'n')] = 1;
  s.scalars["nan"] = std::nan("");
  r.events.assign(1000, std::string(100000, 'e'));
  REQUIRE(f.hub->Report(std::move(r)).ok());
  auto v = f.hub->View("job1");
  REQUIRE(v.ok());
  const RankView& x = RankOf(*v, 0);
  CHECK(x.steps == 50);  // kept
  CHECK(x.cpu_percent == 0);
  CHECK(x.gpu_util_percent == 100);
  CHECK(x.state == RankState::kUnknown);
  CHECK(x.collective_op.size() <= 64);
  CHECK(x.scalars.size() == kMaxScalarsPerRank);
  CHECK(x.scalars_dropped == 5002 - static_cast<std::int64_t>(kMaxScalarsPerRank));
  CHECK(x.anomalies > 0);
  CHECK(v->events.size() <= kMaxTimelineEvents);
  for (const auto& e : v->events) CHECK(e.text.size() <= kMaxEventBytes + 16);
}

TEST_CASE("a rank 50% slower is a straggler within 10 steps, and never a hang", "[metrics]") {
  Fixture f(/*hang_timeout_s=*/5);
  std::int64_t fast = 0, slow = 0;
  bool marked = false;
  int steps_to_mark = -1;
  for (int t = 0; t < 40; ++t) {
    f.clock.Advance(1s);
    REQUIRE(f.hub->Report(f.Report(0, fast + 2, 0.1, fast)).ok());
    MetricsReport r = f.Report(1, slow + 1, 0.15, slow);
    r.ranks[0].steps = slow;  // rank 2 as fast as the others in steps
    r.ranks[0].step_seconds.clear();
    r.ranks[0].steps = slow + 1;
    r.ranks[0].step_seconds = {0.1};
    REQUIRE(f.hub->Report(r).ok());
    fast += 2;
    slow += 1;
    f.hub->Tick();
    auto v = f.hub->View("job1");
    REQUIRE(v.ok());
    if (!marked && RankOf(*v, 3).straggler) {
      marked = true;
      steps_to_mark = static_cast<int>(slow);
    }
    CHECK(!RankOf(*v, 0).straggler);
    CHECK(!RankOf(*v, 2).straggler);
    CHECK(v->hang_state == HangState::kArmed);
  }
  REQUIRE(marked);
  CHECK(steps_to_mark <= 10);
  auto v = f.hub->View("job1");
  CHECK(RankOf(*v, 3).straggler_gap_s == Approx(0.05));
  CHECK(RankOf(*v, 3).slowdown == Approx(1.5));
  CHECK(v->hangs == 0);
  CHECK(f.logged.empty());
}

// Rank 2 stops at step 12; the others reach 20 and wait.
void RunThenHang(Fixture& f) {
  for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(f.Report(n, 10, 0.1, 0)).ok());
  f.clock.Advance(1s);
  REQUIRE(f.hub->Report(f.Report(0, 20, 0.1, 10)).ok());
  MetricsReport r = f.Report(1, 20, 0.1, 10);
  r.ranks[0].steps = 12;
  r.ranks[0].step_seconds = {0.1, 0.1};
  REQUIRE(f.hub->Report(r).ok());
}

MetricsReport StalledReport(Fixture& f, int n) {
  MetricsReport r = f.Report(n, 20, 0.1, 20);
  if (n == 1) r.ranks[0].steps = 12;
  return r;
}

TEST_CASE("a hang names the rank behind, takes its stack and reports once", "[metrics][hang]") {
  Fixture f(/*hang_timeout_s=*/10, "report");
  RunThenHang(f);
  std::vector<int> asked;
  double asked_at = -1;
  std::vector<std::string> printed(2);
  for (int t = 1; t <= 30; ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) {
      MetricsReport r = StalledReport(f, n);
      if (n == 1 && !asked.empty()) {
        StackDump d;
        d.rank = 2;
        d.pid = 502;
        d.host = "host1";
        d.kind = "python";
        d.text = "File \"train.py\", line 7 in <module>\n  time.sleep(3600)";
        r.stacks.push_back(d);
      }
      auto reply = f.hub->Report(r);
      REQUIRE(reply.ok());
      if (!reply->capture_stacks.empty()) {
        CHECK(n == 1);
        CHECK(asked.empty());
        asked = reply->capture_stacks;
        asked_at = t;
      }
      if (!reply->hang_report.empty()) {
        CHECK(printed[n].empty());  // once per node
        printed[n] = reply->hang_report;
      }
    }
  }
  REQUIRE(asked == std::vector<int>{2});
  CHECK(asked_at <= 11);
  for (const auto& p : printed) {
    CHECK_THAT(p, Catch::Contains("[job job1 round 0] HANG"));
    CHECK_THAT(p, Catch::Contains("culprit rank(s) 2"));
    CHECK_THAT(p, Catch::Contains("rank 2 on host1 pid 502, step 12"));
    CHECK_THAT(p, Catch::Contains("waiting: rank(s) 0-1,3"));
    CHECK_THAT(p, Catch::Contains("time.sleep(3600)"));
  }
  REQUIRE(f.logged.size() == 1);
  auto v = f.hub->View("job1");
  CHECK(v->hang_state == HangState::kReported);
  CHECK(v->hangs == 1);
  CHECK(v->hang_report == printed[0]);
  CHECK(v->state == JobState::kRunning);  // report only
  // Progress re-arms it.
  f.clock.Advance(1s);
  MetricsReport r = StalledReport(f, 1);
  r.ranks[0].steps = 13;
  REQUIRE(f.hub->Report(r).ok());
  CHECK(f.hub->View("job1")->hang_state == HangState::kArmed);
}

TEST_CASE("a hang without a stack in time is reported within the stack wait", "[metrics][hang]") {
  Fixture f(10, "report");
  RunThenHang(f);
  std::string printed;
  int at = -1;
  for (int t = 1; t <= 25 && printed.empty(); ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) {
      auto reply = f.hub->Report(StalledReport(f, n));
      REQUIRE(reply.ok());
      if (!reply->hang_report.empty()) {
        printed = reply->hang_report;
        at = t;
      }
    }
  }
  CHECK_THAT(printed, Catch::Contains("stack of rank 2: none (its agent sent no stack in time)"));
  CHECK(at <= 10 + 1 + 5 + 1);
}

TEST_CASE("a slow rank that moves before the stack wait ends is not reported", "[metrics][hang]") {
  Fixture f(10, "report");
  RunThenHang(f);
  for (int t = 1; t <= 11; ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(StalledReport(f, n)).ok());
  }
  CHECK(f.hub->View("job1")->hang_state == HangState::kCapturing);
  MetricsReport r = StalledReport(f, 1);
  r.ranks[0].steps = 13;
  REQUIRE(f.hub->Report(r).ok());
  f.clock.Advance(10s);
  f.hub->Tick();
  CHECK(f.hub->View("job1")->hangs == 0);
  CHECK(f.logged.empty());
}

void HangUntilActed(Fixture& f) {
  RunThenHang(f);
  for (int t = 1; t <= 25 && !f.acted.ok(); ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) (void)f.hub->Report(StalledReport(f, n));
  }
  REQUIRE(f.acted.ok());
}

TEST_CASE("on_hang=restart restarts the round as a failure that names the hung rank",
          "[metrics][hang]") {
  Fixture f(10, "restart", /*max_restarts=*/3);
  HangUntilActed(f);
  for (const auto& s : f.sinks) {
    REQUIRE(!s->events.empty());
    const auto* x = std::get_if<RestartRound>(&s->events.back());
    REQUIRE(x != nullptr);
    CHECK(x->counts_as_failure);
    // The reason the agents print: the culprit hung, not "worker failure on <node>".
    CHECK(x->reason ==
          "rank 2 on host1 (pid 502) hung: no progress for --hang_timeout (see the "
          "hang report) (restart 1 of 3)");
  }
  CHECK(f.table->Status("job1").front().restart_count == 1);
  auto v = f.hub->View("job1");
  CHECK(v->state == JobState::kGathering);
  bool timeline = false;
  for (const auto& e : v->events) timeline |= e.text.find("rank 2 on host1 (pid 502) hung") == 0;
  CHECK(timeline);
}

TEST_CASE("on_hang=restart beyond --max_restarts closes the job, naming the hung rank",
          "[metrics][hang]") {
  Fixture f(10, "restart", /*max_restarts=*/0);
  HangUntilActed(f);
  for (const auto& s : f.sinks) {
    const auto* c = std::get_if<JobClosed>(&s->events.back());
    REQUIRE(c != nullptr);
    CHECK(!c->success);
    CHECK_THAT(c->reason, Catch::StartsWith("rank 2 on host1 (pid 502) hung") &&
                              Catch::EndsWith("and the restart budget (0) is spent"));
    REQUIRE(c->failures.size() == 1);
    CHECK_THAT(c->failures[0].error_message, Catch::Contains("culprit rank(s) 2"));
  }
  CHECK(f.hub->View("job1")->state == JobState::kFailed);
}

TEST_CASE("on_hang=abort closes the job with the hang report", "[metrics][hang]") {
  Fixture f(10, "abort", /*max_restarts=*/3);
  HangUntilActed(f);
  for (const auto& s : f.sinks) {
    const auto* c = std::get_if<JobClosed>(&s->events.back());
    REQUIRE(c != nullptr);
    CHECK(!c->success);
    CHECK_THAT(c->reason, Catch::Contains("HANG"));
    REQUIRE(c->failures.size() == 1);
    CHECK(c->failures[0].global_rank == 2);
    CHECK_THAT(c->failures[0].error_message, Catch::Contains("culprit rank(s) 2"));
  }
  auto v = f.hub->View("job1");
  CHECK(v->state == JobState::kFailed);
  REQUIRE(v->failures.size() == 1);
}

TEST_CASE("no hang is detected without a progress source or while a worker is not running",
          "[metrics][hang]") {
  Fixture f(5, "report");
  for (int t = 0; t < 30; ++t) {
    f.clock.Advance(1s);
    for (int n = 0; n < 2; ++n) {
      MetricsReport r = f.Report(n, 0, 0.1, 0);
      for (auto& s : r.ranks) s.has_progress_source = false;
      REQUIRE(f.hub->Report(r).ok());
    }
    f.hub->Tick();
  }
  CHECK(f.hub->View("job1")->hang_state == HangState::kNoProgressSource);
  CHECK(f.hub->View("job1")->hangs == 0);
}

TEST_CASE("hang culprits: collectives first, then steps", "[metrics][hang]") {
  auto rank = [](int r, std::int64_t steps, std::int64_t seq, bool in) {
    HangRank h;
    h.rank = r;
    h.steps = steps;
    h.collective_seq = seq;
    h.in_collective = in;
    h.collective_op = "allreduce";
    return h;
  };
  // Rank 1 skipped a collective: the others are inside #9, it is not.
  auto v = FindHangCulprits({rank(0, 5, 9, true), rank(1, 5, 9, false), rank(2, 5, 9, true)});
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(v.waiting == std::vector<int>{0, 2});
  // Rank 2 is behind in collectives.
  v = FindHangCulprits({rank(0, 5, 9, true), rank(1, 5, 9, true), rank(2, 5, 8, false)});
  CHECK(v.culprits == std::vector<int>{2});
  // No collectives: the lowest step.
  v = FindHangCulprits({rank(0, 5, 0, false), rank(1, 4, 0, false), rank(2, 5, 0, false)});
  CHECK(v.culprits == std::vector<int>{1});
  // All equal: every rank.
  v = FindHangCulprits({rank(0, 5, 0, false), rank(1, 5, 0, false)});
  CHECK(v.culprits == std::vector<int>{0, 1});
  CHECK(v.waiting.empty());
  CHECK(RankList({0, 1, 2, 4, 6, 7}) == "0-2,4,6-7");
}

TEST_CASE("hang culprits at one step: Python stacks tell the rank outside the collective",
          "[metrics][hang]") {
  auto py = [](int r, std::string text) {
    StackDump d;
    d.rank = r;
    d.kind = "python";
    d.text = std::move(text);
    return d;
  };
  const std::string waiting =
      "Thread 0x1 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", line 197 in "
      "backward\n  File \"/usr/lib/python3/dist-packages/torch/_tensor.py\", line 487 in "
      "backward\n  File \"/job/train.py\", line 41 in main\n";
  const std::string sleeping =
      "Thread 0x1 (most recent call first):\n  File \"/job/train.py\", line 37 in main\n";
  HangRank a, b, c;
  a.rank = 0, b.rank = 1, c.rank = 2;
  a.steps = b.steps = c.steps = 5;
  HangVerdict v = FindHangCulprits({a, b, c});
  REQUIRE(v.culprits == std::vector<int>{0, 1, 2});
  HangVerdict refined = v;
  RefineHangWithStacks(refined, {{0, py(0, waiting)}, {1, py(1, sleeping)}, {2, py(2, waiting)}});
  CHECK(refined.culprits == std::vector<int>{1});
  CHECK(refined.waiting == std::vector<int>{0, 2});
  // Every rank waiting, a native stack, or a missing stack: no change.
  refined = v;
  RefineHangWithStacks(refined, {{0, py(0, waiting)}, {1, py(1, waiting)}, {2, py(2, waiting)}});
  CHECK(refined.culprits == v.culprits);
  refined = v;
  StackDump native = py(1, "#0 nanosleep");
  native.kind = "native";
  RefineHangWithStacks(refined, {{0, py(0, waiting)}, {1, native}, {2, py(2, waiting)}});
  CHECK(refined.culprits == v.culprits);
  refined = v;
  RefineHangWithStacks(refined, {{0, py(0, waiting)}, {1, py(1, sleeping)}});
  CHECK(refined.culprits == v.culprits);
}

TEST_CASE("the time series keeps at least 15 minutes at 2 s and stays bounded", "[metrics]") {
  Fixture f;
  std::int64_t steps = 0;
  for (int t = 0; t < 1800; ++t) {
    f.clock.Advance(1s);
    if (t % 10 == 0) {
      for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(f.Report(n, steps + 10, 0.1, steps)).ok());
      steps += 10;
    }
    f.hub->Tick();
  }
  auto v = f.hub->View("job1");
  REQUIRE(v->series.size() == 600);
  CHECK(v->series.back().unix_s - v->series.front().unix_s >= 15 * 60);
  CHECK(v->series[1].unix_s - v->series[0].unix_s <= 2.0 + 1e-9);
}

TEST_CASE("a closed job keeps its failure report; a forgotten one is gone", "[metrics]") {
  Fixture f;
  WorkerFailure w;
  w.global_rank = 1;
  w.exit_code = 3;
  w.error_message = "boom";
  REQUIRE(f.table->Report("job1", f.node_ids[0], 0, Outcome::kFailed, {w}).ok());
  auto v = f.hub->View("job1");
  CHECK(v->state == JobState::kGathering);
  bool restart = false;
  for (const auto& e : v->events) restart |= e.kind == "restart";
  CHECK(restart);
}

// Node n's report before any step: no progress source; its ranks in
// `in_store` reached the round's store; node 0 hosts the store and names the
// keys waited for there.
MetricsReport StartupReport(Fixture& f, int n, const std::set<int>& in_store) {
  MetricsReport r = f.Report(n, 0, 0, 0);
  for (auto& s : r.ranks) {
    s.has_progress_source = false;
    s.reached_store = in_store.count(s.rank) > 0;
  }
  if (n == 0) r.store_waits = {"default_pg/0//cpu/rank_3"};
  return r;
}

TEST_CASE("a round stuck before its first step names the ranks missing from the store",
          "[metrics][hang]") {
  Fixture f(5, "report");
  std::vector<int> asked;
  std::string printed;
  for (int t = 1; t <= 20 && printed.empty(); ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) {
      auto reply = f.hub->Report(StartupReport(f, n, {0, 1, 2}));
      REQUIRE(reply.ok());
      asked.insert(asked.end(), reply->capture_stacks.begin(), reply->capture_stacks.end());
      if (!reply->hang_report.empty()) printed = reply->hang_report;
    }
  }
  CHECK(asked == std::vector<int>{3});  // the culprit's stack, as for any hang
  INFO(printed);
  CHECK_THAT(printed, Catch::Contains("HANG: no rank made a first step for "));
  CHECK_THAT(printed, Catch::Contains("culprit rank(s) 3: never reached the round's store"));
  CHECK_THAT(printed, Catch::Contains("while rank(s) 0-2 wait there for key(s) "
                                      "default_pg/0//cpu/rank_3"));
  CHECK_THAT(printed,
             Catch::Contains("behind:  rank 3 on host1 pid 503, step 0, never reached the store"));
  auto v = f.hub->View("job1");
  CHECK(v->hangs == 1);
}

TEST_CASE("a rank slow to start that reaches the store is not hung, nor ranks all still starting",
          "[metrics][hang]") {
  Fixture f(5, "abort");
  // Nobody in the store for 8 s (a large import everywhere): nobody waits.
  for (int t = 1; t <= 8; ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(StartupReport(f, n, {})).ok());
  }
  // Ranks 0-2 arrive; rank 3 loads a checkpoint for 4 s more, then arrives.
  for (int t = 1; t <= 4; ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) REQUIRE(f.hub->Report(StartupReport(f, n, {0, 1, 2})).ok());
  }
  for (int t = 1; t <= 20; ++t) {
    f.clock.Advance(1s);
    f.hub->Tick();
    for (int n = 0; n < 2; ++n) {
      auto reply = f.hub->Report(StartupReport(f, n, {0, 1, 2, 3}));
      REQUIRE(reply.ok());
      CHECK(reply->capture_stacks.empty());
      CHECK(reply->hang_report.empty());
    }
  }
  CHECK(f.hub->View("job1")->hangs == 0);
  CHECK(f.acted.code() == absl::StatusCode::kUnknown);  // not acted
}

TEST_CASE("a closed job shows each rank's end state and stops ageing", "[metrics]") {
  SECTION("failed: the failed rank is failed, the others stopped") {
    Fixture f(0, "report", /*max_restarts=*/0);
    REQUIRE(f.hub->Report(f.Report(0, 3, 0.1, 0)).ok());
    REQUIRE(f.hub->Report(f.Report(1, 3, 0.1, 0)).ok());
    f.clock.Advance(2s);
    WorkerFailure w;
    w.global_rank = 1;
    w.exit_code = 3;
    REQUIRE(f.table->Report("job1", f.node_ids[0], 0, Outcome::kFailed, {w}).ok());
    auto v = f.hub->View("job1");
    REQUIRE(v->state == JobState::kFailed);
    CHECK(RankOf(*v, 0).state == RankState::kStopped);
    CHECK(RankOf(*v, 1).state == RankState::kFailed);
    CHECK(RankOf(*v, 2).state == RankState::kStopped);
    CHECK(RankOf(*v, 3).state == RankState::kStopped);
    const double age = RankOf(*v, 0).age_s;
    CHECK(age == Approx(2.0));
    f.clock.Advance(60s);
    auto later = f.hub->View("job1");
    CHECK(RankOf(*later, 0).age_s == Approx(age));
    CHECK(RankOf(*later, 1).state == RankState::kFailed);
  }
  SECTION("succeeded: every rank exited, one never heard from too") {
    Fixture f;
    REQUIRE(f.hub->Report(f.Report(0, 3, 0.1, 0)).ok());
    REQUIRE(f.table->Report("job1", f.node_ids[0], 0, Outcome::kSucceeded, {}).ok());
    REQUIRE(f.table->Report("job1", f.node_ids[1], 0, Outcome::kSucceeded, {}).ok());
    auto v = f.hub->View("job1");
    REQUIRE(v->state == JobState::kSucceeded);
    for (const auto& r : v->ranks) CHECK(r.state == RankState::kExited);
  }
}

}  // namespace
}  // namespace ddprun::rendezvous

namespace ddprun::rendezvous {
namespace {

// A node's recovery record for the fixture's round (docs/recovery.md).
RecoveryBudget Recovered(std::int64_t round, double first_step_ms, std::string cause) {
  RecoveryBudget b;
  b.round = round;
  b.outcome = "recovered";
  b.cause = std::move(cause);
  b.stopped_ms = 5;
  b.round_ms = 8;
  b.started_ms = 9;
  b.first_step_ms = first_step_ms;
  return b;
}

TEST_CASE("recovery budgets: the job's is each phase's slowest node; others are ignored",
          "[metrics]") {
  Fixture f;
  auto last = [&f] { return f.hub->View("job1")->last_recovery; };
  // No record yet; a record that did not recover, or of another round, is not the job's.
  MetricsReport r = f.Report(0, 1, 0.1, 0);
  REQUIRE(f.hub->Report(r).ok());
  CHECK_FALSE(last());
  r.recovery = Recovered(f.round, 100, "worker rank 1 exited with signal SIGKILL");
  r.recovery->outcome = "superseded";
  REQUIRE(f.hub->Report(r).ok());
  r.recovery = Recovered(f.round + 1, 100, "x");
  REQUIRE(f.hub->Report(r).ok());
  CHECK_FALSE(last());
  CHECK(f.hub->View("job1")->recoveries == 0);

  // Two nodes: the slowest of each phase, the cause that names a worker.
  r.recovery = Recovered(f.round, 900, "worker rank 1 exited with signal SIGKILL");
  REQUIRE(f.hub->Report(r).ok());
  MetricsReport other = f.Report(1, 1, 0.1, 0);
  other.recovery = Recovered(f.round, 1200, "restarted: a worker failed on host0");
  other.recovery->stopped_ms = 2;
  other.recovery->started_ms = std::nan("");  // a bad value reads as not reached
  REQUIRE(f.hub->Report(other).ok());
  REQUIRE(f.hub->Report(other).ok());  // sent again with every report: counted once
  auto b = last();
  REQUIRE(b);
  CHECK(b->stopped_ms == 5);
  CHECK(b->started_ms == 9);
  CHECK(b->first_step_ms == 1200);
  CHECK(b->cause == "worker rank 1 exited with signal SIGKILL");
  CHECK(f.hub->View("job1")->recoveries == 1);
}

}  // namespace
}  // namespace ddprun::rendezvous
