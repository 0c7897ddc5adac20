// The agent's round loop in simulated time: scripted workers (FakeLauncher),
// the real round state machine in process (InProcessSession), a FakeClock
// moved by the SimQueue. Success, restart within budget, budget spent,
// SIGTERM -> SIGKILL escalation, signals, spawn errors, a fixed-size job
// that loses a node. No sockets, processes or sleeps (agent_fakes.h); the
// same loop over gRPC and real processes: tests/integration/agent_grpc_test.cc
// and tests/multiproc/.
#include "ddprun/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent_fakes.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "run_agent.h"
#include "support/capture_stderr.h"

namespace ddprun::agent {
namespace {

using namespace testing;  // NOLINT: the fakes

using ::ddprun::test::CaptureStderr;

AgentOptions Options(int nproc, int max_restarts) {
  AgentOptions o;
  o.job_id = "t" + std::to_string(::getpid());
  o.mode = RendezvousMode::kEmbedded;
  o.rdzv_host = "127.0.0.1";
  o.rdzv_port = 0;
  o.nproc_per_node = nproc;
  o.policy.max_restarts = max_restarts;
  o.policy.join_timeout_s = 10;
  o.grace_period_s = 2;
  o.command = {"train", "--local=${local_rank}"};
  return o;
}

TEST_CASE("Agent: every worker exits 0 -> exit 0", "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(50, 0); };
  auto r = RunAgent(world, Options(2, 0));
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(r.seconds < 5);
  REQUIRE(world.rec.spawns.size() == 2);
  for (int j = 0; j < 2; ++j) {
    const SpawnSpec& s = world.rec.spawns[j];
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

// One agent in `world` that the test keeps after Run() returns, as ddprun's
// main() does (it ends the process without destroying the agent), with its
// session in reach.
struct KeptAgent {
  KeptAgent(SimWorld& world, AgentOptions o) {
    BlockAgentSignals();
    auto s = std::make_unique<InProcessSession>(o.job_id, world.clock, world.queue);
    session = s.get();
    AgentDeps deps;
    deps.launcher = std::make_unique<LauncherRef>(world.launcher);
    deps.session = std::move(s);
    deps.clock = &world.clock;
    deps.events = &world.queue;
    agent = std::make_unique<Agent>(std::move(o), std::move(deps));
  }
  InProcessSession* session;
  std::unique_ptr<Agent> agent;
};

// The agent's destructor only joins threads: what others see must be done
// when Run() returns.
TEST_CASE(
    "Agent: Run() returns with the rendezvous left, the launcher closed and the "
    "temporary directory removed, before the agent is destroyed",
    "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(50, 0); };
  CaptureStderr cap;
  KeptAgent kept(world, Options(2, 0));
  REQUIRE(kept.agent->Run() == kExitSuccess);
  CHECK(kept.session->leaves == 1);
  CHECK(world.rec.launcher_closes == 1);
  REQUIRE(world.rec.spawns.size() == 2);
  const std::string error_file = world.rec.spawns[0].env.at("TORCHELASTIC_ERROR_FILE");
  const std::filesystem::path dir = std::filesystem::path(error_file).parent_path();
  INFO(dir.string());
  CHECK_FALSE(dir.empty());
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE(
    "Agent: the session's side services start 100 ms into the first round, once, and "
    "never for a job that is over by then",
    "[unit][agent]") {
  SimWorld world;
  const TimePoint t0 = world.clock.Now();
  CaptureStderr cap;
  SECTION("workers done in 50 ms: never") {
    world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(50, 0); };
    KeptAgent kept(world, Options(2, 0));
    CHECK(kept.agent->Run() == kExitSuccess);
    CHECK(kept.session->workers_started.empty());
  }
  SECTION("a restart after 500 ms, workers done 500 ms into the next round: once, at 100 ms") {
    world.script = [](int index, int, int restart) -> absl::StatusOr<Behaviour> {
      return ExitsAfter(500, restart == 0 && index == 0 ? 1 : 0);
    };
    KeptAgent kept(world, Options(2, 1));
    CHECK(kept.agent->Run() == kExitSuccess);
    CHECK(world.rec.spawns.size() == 4);
    REQUIRE(kept.session->workers_started.size() == 1);
    CHECK(kept.session->workers_started[0] - t0 == std::chrono::milliseconds(100));
  }
}

TEST_CASE("Agent: the session's TCPStore for each round reaches the workers, or fails the spawn",
          "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(50, 0);
  };
  auto r = RunAgent(world, Options(2, 1), [](InProcessSession& s) {
    s.sdk_store = [](const rendezvous::Assignment& a) -> absl::StatusOr<std::string> {
      return "127.0.0.1:" + std::to_string(1000 + a.round);
    };
  });
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 4);
  CHECK(world.rec.spawns[0].env.at("DDPRUN_TCPSTORE_ADDR") ==
        world.rec.spawns[1].env.at("DDPRUN_TCPSTORE_ADDR"));
  // The restart's round has a store of its own.
  CHECK(world.rec.spawns[2].env.at("DDPRUN_TCPSTORE_ADDR") !=
        world.rec.spawns[0].env.at("DDPRUN_TCPSTORE_ADDR"));

  SimWorld failing;
  failing.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(50, 0); };
  auto f = RunAgent(failing, Options(2, 0), [](InProcessSession& s) {
    s.sdk_store = [](const rendezvous::Assignment&) -> absl::StatusOr<std::string> {
      return absl::ResourceExhaustedError("the store is full");
    };
  });
  CHECK(f.rc != kExitSuccess);
  CHECK(failing.rec.spawns.empty());
  CHECK(f.err.find("cannot prepare the workers' store: the store is full") != std::string::npos);
}

TEST_CASE("Agent: a failure within the restart budget restarts every worker", "[unit][agent]") {
  SimWorld world;
  // First attempt: local rank 1 exits 3, local rank 0 runs until stopped.
  // Second attempt: both succeed.
  world.script = [](int, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(50, 0);
  };
  auto r = RunAgent(world, Options(2, 1));
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(r.seconds < 5);
  REQUIRE(world.rec.spawns.size() == 4);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});  // the survivor was stopped
  CHECK(world.rec.spawns[2].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(world.rec.spawns[3].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(world.rec.spawns[2].env.at("DDPRUN_ROUND") != world.rec.spawns[0].env.at("DDPRUN_ROUND"));
}

TEST_CASE("Agent: budget spent -> exit 1 with the job's failure report", "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int local, int) -> absl::StatusOr<Behaviour> {
    return local == 1 ? ExitsAfter(50, 7) : Runs();
  };
  AgentOptions o = Options(2, 0);
  const std::string job = o.job_id;
  auto r = RunAgent(world, o);
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
  SimWorld world;
  world.script = [](int, int local, int) -> absl::StatusOr<Behaviour> {
    if (local == 0) return ExitsAfter(50, 1);
    Behaviour b;
    b.ignore_term = true;
    return b;
  };
  AgentOptions o = Options(2, 0);
  o.grace_period_s = 0.3;
  auto r = RunAgent(world, o);
  INFO(r.err);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.seconds < 5);
  CHECK(r.seconds >= 0.35);  // the 0.3 s grace period passed (in simulated time)
  CHECK(world.rec.signals[1] == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(r.err.find("workers did not exit within 0.3 s of SIGTERM; sending SIGKILL") !=
        std::string::npos);
}

TEST_CASE("Agent: SIGTERM is forwarded to the workers; exit 128+15", "[unit][agent]") {
  SimWorld world;
  // The signal arrives 100 ms after the workers started (the join is instant).
  world.queue.After(milliseconds(100), [&] { world.queue.Push(SignalEvent{SIGTERM}); });
  auto r = RunAgent(world, Options(2, 3));
  INFO(r.err);
  CHECK(r.rc == 128 + SIGTERM);
  CHECK(r.seconds < 5);
  REQUIRE(world.rec.signals.size() == 2);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});
  CHECK(world.rec.signals[1] == std::vector<int>{SIGTERM});
}

TEST_CASE("Agent: a second SIGTERM while stopping escalates to SIGKILL at once", "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> {
    Behaviour b;
    b.ignore_term = true;
    return b;
  };
  world.queue.After(milliseconds(100), [&] { world.queue.Push(SignalEvent{SIGTERM}); });
  world.queue.After(milliseconds(200), [&] { world.queue.Push(SignalEvent{SIGTERM}); });
  auto r = RunAgent(world, Options(1, 0));
  INFO(r.err);
  CHECK(r.rc == 128 + SIGTERM);
  CHECK(r.seconds < 1);  // not the 2 s grace period
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(r.err.find("while stopping workers; killing them now") != std::string::npos);
}

TEST_CASE("Agent: SIGUSR1 is forwarded only when asked, and the job goes on", "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(500, 0); };
  world.queue.After(milliseconds(100), [&] { world.queue.Push(SignalEvent{SIGUSR1}); });
  world.queue.After(milliseconds(200), [&] { world.queue.Push(SignalEvent{SIGUSR2}); });
  AgentOptions o = Options(1, 0);
  o.forward_sigusr1 = true;
  auto r = RunAgent(world, o);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGUSR1});
  CHECK(r.err.find("forwarding SIGUSR1 to the workers") != std::string::npos);
  CHECK(r.err.find("ignoring SIGUSR2; add it to --forward_signals") != std::string::npos);
}

TEST_CASE("Agent: SIGUSR1 listed in --signals_to_handle stops the node as torchrun does",
          "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(5000, 0); };
  world.queue.After(milliseconds(100), [&] { world.queue.Push(SignalEvent{SIGUSR1}); });
  AgentOptions o = Options(1, 0);
  o.stop_on_sigusr1 = true;
  auto r = RunAgent(world, o);
  INFO(r.err);
  CHECK(r.rc == 128 + SIGUSR1);
  CHECK(world.rec.signals[0].front() == SIGUSR1);
  CHECK(r.err.find("received SIGUSR1; forwarding it to the workers") != std::string::npos);
}

TEST_CASE("Agent: a worker that cannot be spawned fails the node", "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int local, int) -> absl::StatusOr<Behaviour> {
    if (local == 1) {
      return absl::NotFoundError("cannot start worker: 'train' was not found in PATH");
    }
    return Runs();
  };
  auto r = RunAgent(world, Options(2, 0));
  INFO(r.err);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.err.find("was not found in PATH") != std::string::npos);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});
}

TEST_CASE("Agent: a rendezvous that cannot be opened is a one-line error, exit 3",
          "[unit][agent]") {
  SimWorld world;
  auto r = RunAgent(world, Options(1, 0), [](InProcessSession& s) {
    s.open_status = absl::UnavailableError("cannot reach the rendezvous at 192.0.2.1:29400");
  });
  CHECK(r.rc == kExitRendezvousError);
  CHECK(r.err.find("] cannot reach the rendezvous at 192.0.2.1:29400\n") != std::string::npos);
  CHECK(world.rec.spawns.empty());
}

TEST_CASE("Agent: a fixed-size job that loses a node says what it waits for, then exits 3",
          "[unit][agent]") {
  SimWorld world;
  AgentOptions o = Options(1, 0);
  o.min_nodes = o.max_nodes = 2;
  o.policy.join_timeout_s = 10;
  std::string phantom;
  auto r = RunAgent(world, o, [&](InProcessSession& s) {
    phantom = s.PhantomJoin(o, "10.0.0.9");  // the other node, already waiting
    // One second into the round, the other node's agent is lost.
    world.queue.After(std::chrono::seconds(1), [&s, &phantom] { s.PhantomLost(phantom); });
  });
  INFO(r.err);
  CHECK(r.rc == kExitRendezvousError);
  REQUIRE(world.rec.spawns.size() == 1);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});  // the round's workers stopped
  // One line, fenced with the new round, when the wait starts (1 s after
  // re-joining): what it waits for and until when.
  const std::string fence = "ddprun: [job " + o.job_id + " round 1] ";
  const std::size_t at = r.err.find(fence +
                                    "a node left this fixed-size job (--nnodes=2): "
                                    "waiting for a replacement, 1 of 2 nodes have joined; the job "
                                    "fails with exit code 3 unless 2 nodes join by ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
  CHECK(line.find(" (in 9 s, --rdzv_conf join_timeout)") != std::string::npos);
  // The rendezvous' verdict at the join timeout, fenced once.
  CHECK(r.err.find("ddprun: [job " + o.job_id +
                   " round 1] rendezvous timed out after 10 s with "
                   "1 of 2 required nodes") != std::string::npos);
  CHECK(r.err.find("] [job ") == std::string::npos);
  // Lost at 1 s, the join timeout 10 s after the re-join.
  CHECK(r.seconds == Approx(11).margin(0.5));
}

TEST_CASE("Agent: with replace_lost_nodes off, a lost node stops the job at once with exit 3",
          "[unit][agent]") {
  SimWorld world;
  AgentOptions o = Options(1, 0);
  o.min_nodes = o.max_nodes = 2;
  o.replace_lost_nodes = false;  // ddprun bench --scaling across nodes
  std::string phantom;
  auto r = RunAgent(world, o, [&](InProcessSession& s) {
    phantom = s.PhantomJoin(o, "10.0.0.9");
    world.queue.After(std::chrono::seconds(1), [&s, &phantom] { s.PhantomLost(phantom); });
  });
  INFO(r.err);
  CHECK(r.rc == kExitRendezvousError);
  REQUIRE(world.rec.spawns.size() == 1);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});
  CHECK(r.err.find("ddprun: [job " + o.job_id + " round 0] stopping the workers: agent " + phantom +
                   " was lost, and this job cannot take a replacement node\n") !=
        std::string::npos);
  CHECK(r.err.find("waiting for a replacement") == std::string::npos);
  CHECK(r.seconds < 5);  // not the 10 s join timeout
}

TEST_CASE("Agent: a restart for a worker failure does not announce a replacement wait",
          "[unit][agent]") {
  SimWorld world;
  world.script = [](int, int, int) -> absl::StatusOr<Behaviour> { return ExitsAfter(100, 1); };
  AgentOptions o = Options(1, 1);
  o.min_nodes = o.max_nodes = 2;
  auto r = RunAgent(world, o, [&](InProcessSession& s) { s.PhantomJoin(o, "10.0.0.9"); });
  INFO(r.err);
  // The other node never re-joins: the round times out, but nobody left.
  CHECK(r.rc == kExitRendezvousError);
  CHECK(r.err.find("restarting: worker failure on") != std::string::npos);
  CHECK(r.err.find("waiting for a replacement") == std::string::npos);
  CHECK(r.err.find("rendezvous timed out after 10 s") != std::string::npos);
}

}  // namespace
}  // namespace ddprun::agent
