// The agent loop with a scripted fake launcher, against the embedded
// rendezvous (loopback, port 0): success, restart within budget, budget
// spent, SIGTERM -> SIGKILL escalation, signals, spawn errors.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "ddprun/agent/agent.h"

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// How one fake worker behaves.
struct Behaviour {
  std::optional<milliseconds> exit_after;  // nullopt: runs until signalled
  ExitStatus status;                       // how it exits on its own
  bool ignore_term = false;                // only SIGKILL ends it
};

// Shared record of everything the fake launcher saw.
struct Record {
  std::mutex mu;
  std::vector<SpawnSpec> spawns;
  std::vector<std::vector<int>> signals;  // per spawn index
};

// Wakes the agent like a real child's exit would.
void NotifyChildChanged() { ::kill(::getpid(), SIGCHLD); }

class FakeChild final : public ChildProcess {
 public:
  FakeChild(int index, Behaviour b, std::shared_ptr<Record> rec)
      : index_(index), b_(b), rec_(std::move(rec)), start_(SteadyClock::now()) {
    if (b_.exit_after) {
      // Delivers SIGCHLD when the scripted exit happens.
      auto after = *b_.exit_after;
      std::thread([after] {
        std::this_thread::sleep_for(after + milliseconds(1));
        NotifyChildChanged();
      }).detach();
    }
  }
  pid_t pid() const override { return 100000 + index_; }
  std::optional<ExitStatus> Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!exit_ && b_.exit_after && SteadyClock::now() - start_ >= *b_.exit_after) {
      exit_ = b_.status;
    }
    return exit_;
  }
  void SignalGroup(int sig) override {
    {
      std::lock_guard<std::mutex> rl(rec_->mu);
      rec_->signals[index_].push_back(sig);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_) return;
    if (sig == SIGKILL || (!b_.ignore_term && (sig == SIGTERM || sig == SIGINT ||
                                              sig == SIGHUP || sig == SIGQUIT))) {
      exit_ = ExitStatus{0, sig};
      NotifyChildChanged();
    }
  }

 private:
  const int index_;
  const Behaviour b_;
  std::shared_ptr<Record> rec_;
  const SteadyClock::time_point start_;
  std::mutex mu_;
  std::optional<ExitStatus> exit_;
};

// script(spawn_index, local_rank, restart_count) -> behaviour, or an error.
using Script = std::function<absl::StatusOr<Behaviour>(int, int, int)>;

class FakeLauncher final : public ProcessLauncher {
 public:
  FakeLauncher(Script script, std::shared_ptr<Record> rec)
      : script_(std::move(script)), rec_(std::move(rec)) {}
  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) override {
    int index;
    {
      std::lock_guard<std::mutex> lock(rec_->mu);
      index = static_cast<int>(rec_->spawns.size());
      rec_->spawns.push_back(spec);
      rec_->signals.emplace_back();
    }
    auto b = script_(index, std::stoi(spec.env.at("LOCAL_RANK")),
                     std::stoi(spec.env.at("TORCHELASTIC_RESTART_COUNT")));
    if (!b.ok()) return b.status();
    return std::unique_ptr<ChildProcess>(std::make_unique<FakeChild>(index, *b, rec_));
  }

 private:
  Script script_;
  std::shared_ptr<Record> rec_;
};

// Redirects fd 2 to a file for the scope; text() gives what was written.
class CaptureStderr {
 public:
  CaptureStderr() : path_("/tmp/ddprun_agent_test_stderr_" + std::to_string(::getpid())) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() { Restore(); ::unlink(path_.c_str()); }
  std::string text() {
    Restore();
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

AgentOptions Options(int nproc, int max_restarts) {
  AgentOptions o;
  o.job_id = "t" + std::to_string(::getpid());
  o.mode = RendezvousMode::kEmbedded;
  o.rdzv_host = "127.0.0.1";
  o.rdzv_port = 0;
  o.nproc_per_node = nproc;
  o.max_restarts = max_restarts;
  o.join_timeout_s = 10;
  o.grace_period_s = 2;
  o.command = {"train", "--local=${local_rank}"};
  return o;
}

Behaviour ExitsAfter(int ms, int code) { return Behaviour{milliseconds(ms), ExitStatus{code, 0}, false}; }
Behaviour Runs() { return Behaviour{}; }

struct Result {
  int rc;
  double seconds;
  std::string err;
};

Result RunAgent(AgentOptions o, Script script, std::shared_ptr<Record> rec) {
  BlockAgentSignals();
  CaptureStderr cap;
  auto t0 = SteadyClock::now();
  int rc;
  {
    Agent agent(std::move(o), std::make_unique<FakeLauncher>(std::move(script), rec));
    rc = agent.Run();
  }
  double s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return Result{rc, s, cap.text()};
}

TEST_CASE("Agent: every worker exits 0 -> exit 0", "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  auto r = RunAgent(Options(2, 0), [](int, int, int) { return ExitsAfter(50, 0); }, rec);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(r.seconds < 5);
  REQUIRE(rec->spawns.size() == 2);
  for (int j = 0; j < 2; ++j) {
    const SpawnSpec& s = rec->spawns[j];
    CHECK(s.argv == std::vector<std::string>{"train", "--local=" + std::to_string(j)});
    CHECK(s.env.at("RANK") == std::to_string(j));
    CHECK(s.env.at("LOCAL_RANK") == std::to_string(j));
    CHECK(s.env.at("WORLD_SIZE") == "2");
    CHECK(s.env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(std::stoi(s.env.at("MASTER_PORT")) > 0);
    CHECK(s.env.at("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(s.env.at("DDPRUN_STORE_ADDR").rfind("127.0.0.1:", 0) == 0);
    CHECK_FALSE(s.env.at("DDPRUN_TOKEN").empty());
  }
}

TEST_CASE("Agent: a failure within the restart budget restarts every worker",
          "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  // First attempt: local rank 1 exits 3, local rank 0 runs until stopped.
  // Second attempt: both succeed.
  auto script = [](int, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(50, 0);
  };
  auto r = RunAgent(Options(2, 1), script, rec);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(r.seconds < 5);
  REQUIRE(rec->spawns.size() == 4);
  CHECK(rec->signals[0] == std::vector<int>{SIGTERM});  // the survivor was stopped
  CHECK(rec->spawns[2].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(rec->spawns[3].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(rec->spawns[2].env.at("DDPRUN_ROUND") != rec->spawns[0].env.at("DDPRUN_ROUND"));
}

TEST_CASE("Agent: budget spent -> exit 1 with the job's failure report", "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  AgentOptions o = Options(2, 0);
  const std::string job = o.job_id;
  auto r = RunAgent(o,
                    [](int, int local, int) -> absl::StatusOr<Behaviour> {
                      return local == 1 ? ExitsAfter(50, 7) : Runs();
                    },
                    rec);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.seconds < 5);
  INFO(r.err);
  CHECK(r.err.find("ddprun: job " + job +
                   " failed: worker rank 1 (local rank 1) on 127.0.0.1 exited with exit code 7") !=
        std::string::npos);
  // The worker stopped by the agent is not reported as a failure.
  CHECK(r.err.find("worker rank 0 (local rank 0) on 127.0.0.1 exited") == std::string::npos);
}

TEST_CASE("Agent: a worker that ignores SIGTERM gets SIGKILL after the grace period",
          "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  AgentOptions o = Options(2, 0);
  o.grace_period_s = 0.3;
  auto r = RunAgent(o,
                    [](int, int local, int) -> absl::StatusOr<Behaviour> {
                      if (local == 0) return ExitsAfter(50, 1);
                      Behaviour b;
                      b.ignore_term = true;
                      return b;
                    },
                    rec);
  INFO(r.err);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.seconds < 5);
  CHECK(rec->signals[1] == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(r.err.find("sending SIGKILL") != std::string::npos);
}

TEST_CASE("Agent: SIGTERM is forwarded to the workers; exit 128+15", "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  BlockAgentSignals();  // before the thread below exists
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    // Wait until the workers run, then signal the process.
    auto deadline = SteadyClock::now() + std::chrono::seconds(5);
    while (!stop && SteadyClock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(rec->mu);
        if (rec->spawns.size() == 2) break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    std::this_thread::sleep_for(milliseconds(100));
    ::kill(::getpid(), SIGTERM);
  });
  auto r = RunAgent(Options(2, 3), [](int, int, int) { return Runs(); }, rec);
  stop = true;
  sender.join();
  INFO(r.err);
  CHECK(r.rc == 128 + SIGTERM);
  CHECK(r.seconds < 5);
  REQUIRE(rec->signals.size() == 2);
  CHECK(rec->signals[0] == std::vector<int>{SIGTERM});
  CHECK(rec->signals[1] == std::vector<int>{SIGTERM});
}

TEST_CASE("Agent: a worker that cannot be spawned fails the node", "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  auto r = RunAgent(Options(2, 0),
                    [](int, int local, int) -> absl::StatusOr<Behaviour> {
                      if (local == 1) {
                        return absl::NotFoundError(
                            "cannot start worker: 'train' was not found in PATH");
                      }
                      return Runs();
                    },
                    rec);
  INFO(r.err);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.err.find("was not found in PATH") != std::string::npos);
  CHECK(rec->signals[0] == std::vector<int>{SIGTERM});
}

TEST_CASE("Agent: an unreachable rendezvous is a one-line error within the join timeout",
          "[unit][agent]") {
  auto rec = std::make_shared<Record>();
  AgentOptions o = Options(1, 0);
  o.mode = RendezvousMode::kRemote;
  o.rdzv_host = "192.0.2.1";  // TEST-NET-1: never this machine
  o.rdzv_port = 29400;
  o.join_timeout_s = 1;
  auto r = RunAgent(o, [](int, int, int) { return Runs(); }, rec);
  INFO(r.err);
  CHECK(r.rc == kExitRendezvousError);
  CHECK(r.seconds < 5);
  CHECK(r.err.find("cannot reach the rendezvous at 192.0.2.1:29400") != std::string::npos);
  CHECK(rec->spawns.empty());
}

}  // namespace
}  // namespace ddprun::agent
