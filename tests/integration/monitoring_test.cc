// Monitoring on the agent's side with real workers: the agent over the real
// gRPC session (embedded rendezvous) wrapped by a session that records every
// MetricsReport and answers as a server would (stacks to take, a hang report
// to print). A PyTorch DDP script on gloo under the start-up hook, and the
// C++ SDK trainer (tests/fixtures/metrics_trainer.cc). The server side
// (hub, hang decision) has its own tests.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/agent/agent.h"
#include "ddprun/agent/stack_capture.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "support/capture_stderr.h"
#include "support/skip.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using ::ddprun::test::CaptureStderr;
using ::ddprun::test::SkipCase;

// Forwards everything to the real session, except ReportMetrics, which it
// records and answers with `answer`.
class RecordingSession final : public RendezvousSession {
 public:
  using Answer = std::function<rdzv::MetricsReply(const rdzv::MetricsReport&)>;
  RecordingSession(std::unique_ptr<RendezvousSession> inner, Answer answer)
      : inner_(std::move(inner)), answer_(std::move(answer)) {}

  absl::Status Open(rdzv::TimePoint d, const std::function<bool()>& i) override {
    return inner_->Open(d, i);
  }
  absl::Status PrepareRound() override { return inner_->PrepareRound(); }
  int master_port() const override { return inner_->master_port(); }
  std::string endpoint() const override { return inner_->endpoint(); }
  std::string advertised_host() const override { return inner_->advertised_host(); }
  bool hosts_rendezvous() const override { return inner_->hosts_rendezvous(); }
  std::uint64_t Join(const rdzv::JoinSpec& spec, EventQueue& events) override {
    return inner_->Join(spec, events);
  }
  void EndJoin() override { inner_->EndJoin(); }
  absl::Status WaitForConnected(rdzv::Duration t) override { return inner_->WaitForConnected(t); }
  absl::Status Report(const rdzv::Assignment& a, rdzv::Outcome o,
                      const std::vector<rdzv::WorkerFailure>& f, rdzv::Duration t) override {
    return inner_->Report(a, o, f, t);
  }
  absl::StatusOr<rdzv::JobStatus> JobStatus(rdzv::Duration t) override {
    return inner_->JobStatus(t);
  }
  absl::StatusOr<rdzv::MetricsReply> ReportMetrics(const rdzv::MetricsReport& r,
                                                   rdzv::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    reports_.push_back(r);
    return answer_(r);
  }
  void Close() override { inner_->Close(); }

  std::vector<rdzv::MetricsReport> reports() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }

 private:
  std::unique_ptr<RendezvousSession> inner_;
  Answer answer_;
  mutable std::mutex mu_;
  std::vector<rdzv::MetricsReport> reports_;
};

AgentOptions Options(int nproc, std::vector<std::string> command) {
  AgentOptions o;
  o.job_id = "mon" + std::to_string(::getpid());
  o.mode = RendezvousMode::kEmbedded;
  o.nproc_per_node = nproc;
  o.policy.join_timeout_s = 30;
  o.grace_period_s = 3;
  o.command = std::move(command);
  return o;
}

// Runs the agent until the workers end or `answer` pushes SIGTERM on the
// queue it gets. Returns the exit code; the reports and stderr come back.
struct Run {
  int rc = -1;
  std::string err;
  std::vector<rdzv::MetricsReport> reports;
};

Run RunAgent(
    AgentOptions o,
    const std::function<rdzv::MetricsReply(const rdzv::MetricsReport&, EventQueue&)>& answer) {
  BlockAgentSignals();
  CaptureStderr cap;
  auto events = MakeEventQueue(rdzv::SystemClock::Get());
  EventQueue* q = events.get();
  auto session = std::make_unique<RecordingSession>(
      MakeGrpcRendezvousSession(o, rdzv::SystemClock::Get()),
      [q, answer](const rdzv::MetricsReport& r) { return answer(r, *q); });
  RecordingSession* recorder = session.get();
  Run out;
  {
    AgentDeps deps;
    deps.session = std::move(session);
    deps.events = events.get();
    deps.launcher = MakeBoostProcessLauncher();
    // The caller's queue gets no signal watcher; SIGCHLD still has to wake
    // the loop: the agent polls its workers every second anyway.
    Agent agent(std::move(o), std::move(deps));
    out.rc = agent.Run();
    out.reports = recorder->reports();
  }
  out.err = cap.text();
  return out;
}

// The largest value of `f` over every report of `rank`.
template <class F>
double MaxOf(const std::vector<rdzv::MetricsReport>& reports, int rank, F f) {
  double best = -1e300;
  for (const auto& r : reports) {
    for (const auto& s : r.ranks) {
      if (s.rank == rank) best = std::max(best, static_cast<double>(f(s)));
    }
  }
  return best;
}

int LineOf(const std::string& path, const std::string& marker) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find(marker) != std::string::npos) return n;
  }
  return -1;
}

bool TorchAvailable() {
  static const bool ok = std::system(
                             "timeout -k 5 60 /usr/bin/python3 -c 'import torch.distributed' "
                             ">/dev/null 2>&1") == 0;
  return ok;
}

const std::string kHangScript = std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/hang_ddp.py";

TEST_CASE("an unmodified PyTorch DDP script: the hook's steps, samples and Python stack",
          "[integration][torch]") {
  if (!TorchAvailable()) return SkipCase("integration", "/usr/bin/python3 cannot import torch");
  AgentOptions o = Options(2, {"/usr/bin/python3", kHangScript});
  o.extra_env = {{"STEPS", "30"}, {"BATCH", "8"}, {"SLEEP_AFTER_S", "60"}};
  std::mutex mu;
  bool asked = false;
  std::vector<rdzv::StackDump> stacks;
  const std::string where =
      "hang_ddp.py\", line " + std::to_string(LineOf(kHangScript, "SLEEP_LINE"));
  int captures = 0;
  auto r = RunAgent(o, [&](const rdzv::MetricsReport& rep, EventQueue& q) {
    std::lock_guard<std::mutex> lock(mu);
    rdzv::MetricsReply reply;
    reply.hang_report = "TEST HANG REPORT: printed once";
    if (!rep.stacks.empty()) {
      stacks = rep.stacks;
      // The 30th step is counted at opt.step(), before that step's sleep:
      // a capture may find rank 1 still in the loop. Ask again (bounded)
      // until it rests on SLEEP_LINE; the check below fails if it never does.
      if (++captures < 10 && stacks[0].text.find(where) == std::string::npos) {
        asked = false;
        return reply;
      }
      q.Push(SignalEvent{SIGTERM});  // done: stop the job
      return reply;
    }
    bool all_done = rep.ranks.size() == 2;
    for (const auto& s : rep.ranks) all_done = all_done && s.steps == 30;
    if (all_done && !asked) {
      asked = true;
      reply.capture_stacks = {1};
    }
    return reply;
  });
  INFO(r.err);
  CHECK(r.rc == 128 + SIGTERM);
  REQUIRE(!r.reports.empty());
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.steps; }) == 30);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.samples_total; }) == 240);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.has_progress_source ? 1 : 0; }) == 1);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.rss_bytes; }) > 20e6);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.cpu_percent; }) > 0);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.gpu_util_percent; }) <= 100);
    std::size_t durations = 0;
    for (const auto& rep : r.reports) {
      for (const auto& s : rep.ranks) {
        if (s.rank != rank) continue;
        durations += s.step_seconds.size();
        for (double d : s.step_seconds) CHECK((d > 0 && d < 30));
      }
    }
    CHECK(durations == 29);  // every step but the first, each reported once
  }
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0].rank == 1);
  CHECK(stacks[0].kind == "python");
  CHECK(stacks[0].host == "127.0.0.1");
  CHECK_THAT(stacks[0].text, Catch::Contains(where));
  CHECK_THAT(stacks[0].text, Catch::Contains("(most recent call last)"));
  // The hang report was printed once although every reply carried it.
  const std::size_t first = r.err.find("TEST HANG REPORT");
  CHECK(first != std::string::npos);
  CHECK(r.err.find("TEST HANG REPORT", first + 1) == std::string::npos);
}

TEST_CASE("a C++ SDK trainer: steps, scalars, every collective, native stack", "[integration]") {
  AgentOptions o = Options(2, {std::string(DDPRUN_BIN_DIR) + "/metrics_trainer"});
  o.extra_env = {{"STEPS", "30"}, {"STEP_MS", "5"}, {"SLEEP_AFTER_S", "60"}};
  std::mutex mu;
  bool asked = false;
  std::vector<rdzv::StackDump> stacks;
  auto r = RunAgent(o, [&](const rdzv::MetricsReport& rep, EventQueue& q) {
    std::lock_guard<std::mutex> lock(mu);
    rdzv::MetricsReply reply;
    if (!rep.stacks.empty()) {
      stacks = rep.stacks;
      q.Push(SignalEvent{SIGTERM});
      return reply;
    }
    bool all_done = rep.ranks.size() == 2;
    for (const auto& s : rep.ranks) all_done = all_done && s.steps == 30;
    if (all_done && !asked) {
      asked = true;
      reply.capture_stacks = {0, 7};  // 7 is not on this node: ignored
    }
    return reply;
  });
  INFO(r.err);
  CHECK(r.rc == 128 + SIGTERM);
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.steps; }) == 30);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.samples_total; }) == 480);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.collective_seq; }) >= 30);
    CHECK(MaxOf(r.reports, rank, [](auto& s) { return s.comm_seconds_total; }) > 0);
    const rdzv::RankSample* last = nullptr;
    for (const auto& rep : r.reports) {
      for (const auto& s : rep.ranks) {
        if (s.rank == rank) last = &s;
      }
    }
    REQUIRE(last != nullptr);
    CHECK(last->scalars.count("loss") == 1);
    CHECK(!last->in_collective);
    bool allreduce = false;
    for (const auto& c : last->collectives) {
      if (c.op != "allreduce") continue;
      allreduce = true;
      CHECK(c.count >= 30);
      CHECK(c.bytes_total >= 30 * 4096);
      CHECK(c.busbw_gbps > 0);
    }
    CHECK(allreduce);
  }
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0].rank == 0);
  INFO(stacks[0].text << stacks[0].error);
  CHECK((stacks[0].kind == "native" || stacks[0].kind == "kernel"));
  if (stacks[0].kind == "native") {
    CHECK_THAT(stacks[0].text, Catch::Contains("#0"));
    CHECK_THAT(stacks[0].text, Catch::Contains("main"));
  }
}

TEST_CASE("faulthandler's order becomes innermost last", "[integration]") {
  const std::string in =
      "Thread 0x01 (most recent call first):\n"
      "  File \"a.py\", line 3 in inner\n"
      "  File \"a.py\", line 9 in <module>\n"
      "\n"
      "Current thread 0x02 (most recent call first):\n"
      "  File \"b.py\", line 1 in run\n";
  CHECK(PythonStackInnermostLast(in) ==
        "Thread 0x01 (most recent call last):\n"
        "  File \"a.py\", line 9 in <module>\n"
        "  File \"a.py\", line 3 in inner\n"
        "Current thread 0x02 (most recent call last):\n"
        "  File \"b.py\", line 1 in run\n");
}

}  // namespace
}  // namespace ddprun::agent
