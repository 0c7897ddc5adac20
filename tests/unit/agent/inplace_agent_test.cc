// --restart_policy=inplace in the agent's round loop, in simulated time
// (agent_fakes.h): the fake workers "register" and "acknowledge" through the
// real control blocks (the memfd the agent hands them, mapped here), as
// ddprun.inprocess.run does. A registered survivor is kept (never
// signalled) and gets the new round in its block; one that never registered,
// or that does not acknowledge within the deadline, is restarted as a
// process, each with its line. The same with real processes and PyTorch:
// tests/e2e/inplace_test.cc.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>

#include "agent_fakes.h"
#include "ddprun/agent/agent.h"
#include "ddprun/agent/inplace_blocks.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/inplace_layout.h"
#include "run_agent.h"

namespace ddprun::agent {
namespace {

using namespace testing;  // NOLINT: the fakes
namespace layout = ::ddprun::inplace_layout;

AgentOptions Options(int nproc) {
  AgentOptions o;
  o.job_id = "ip" + std::to_string(::getpid());
  o.mode = RendezvousMode::kEmbedded;
  o.rdzv_host = "127.0.0.1";
  o.rdzv_port = 0;
  o.nproc_per_node = nproc;
  o.policy.max_restarts = 2;
  o.policy.join_timeout_s = 10;
  o.policy.restart_policy = rendezvous::RestartPolicy::kInplace;
  o.grace_period_s = 2;
  o.command = {"train"};
  return o;
}

// A worker's view of its block: the descriptor the spawn passed, mapped.
class WorkerBlock {
 public:
  explicit WorkerBlock(const SpawnSpec& spec) {
    const int fd = std::stoi(spec.env.at(layout::kEnvFd));
    void* p = ::mmap(nullptr, layout::kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<unsigned char*>(p);
  }
  ~WorkerBlock() { ::munmap(base_, layout::kBlockBytes); }
  template <class T>
  T Get(std::uint64_t off) const {
    T v;
    std::memcpy(&v, base_ + off, sizeof v);
    return v;
  }
  template <class T>
  void Set(std::uint64_t off, T v) {
    std::memcpy(base_ + off, &v, sizeof v);
  }
  void Register(pid_t pid) {
    Set<std::uint32_t>(layout::kWorkerPidOffset, static_cast<std::uint32_t>(pid));
    Set<std::uint32_t>(layout::kWorkerFlagsOffset, layout::kFlagCanReform);
  }
  std::string Env() const {
    const auto n = Get<std::uint32_t>(layout::kEnvBytesOffset);
    return std::string(reinterpret_cast<const char*>(base_ + layout::kEnvOffset), n);
  }

 private:
  unsigned char* base_ = nullptr;
};

// Maps spawn `index`'s block and registers the worker (pid 100000) 10 ms
// later, as ddprun.inprocess.run does once it starts; returns the block.
std::shared_ptr<WorkerBlock> RegistersSoon(SimWorld& world, int index = 0) {
  auto block = std::make_shared<WorkerBlock>(world.rec.spawns[index]);
  world.queue.After(milliseconds(10), [block] { block->Register(100000); });
  return block;
}

// One node of an elastic job of one or two nodes whose round closes 1 s
// after the first node joined.
AgentOptions ElasticOfTwo() {
  AgentOptions o = Options(1);
  o.min_nodes = 1;
  o.max_nodes = 2;
  o.policy.last_call_timeout_s = 1;
  return o;
}

// What a survivor saw of its block after the failure.
struct Seen {
  std::uint64_t generation = 0;  // one break
  std::uint32_t state_after_publish = 99;
  std::string env;
};

}  // namespace

TEST_CASE("Agent inplace: a registered survivor keeps its process and gets the new round",
          "[unit][agent][inplace]") {
  SimWorld world;
  Seen seen;
  // Spawn 0 (local rank 0) registers at once and survives; spawn 1 (local
  // rank 1) exits 3 at 100 ms; its replacement (spawn 2) exits 0 later.
  world.script = [&](int index, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      auto block = RegistersSoon(world);
      // Once re-formed (the simulated rendezvous forms the round at once):
      // one break, the round's variables ready.
      world.queue.After(milliseconds(300), [block, &seen] {
        seen.generation = block->Get<std::uint64_t>(layout::kGenerationOffset);
        seen.state_after_publish = block->Get<std::uint32_t>(layout::kStateOffset);
        seen.env = block->Env();
        block->Set<std::uint64_t>(layout::kWorkerAckOffset,
                                  block->Get<std::uint64_t>(layout::kGenerationOffset));
      });
      return ExitsAfter(600, 0);
    }
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(100, 0);
  };
  auto r = RunAgent(world, Options(2));
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 3);  // local rank 1 twice, local rank 0 once
  CHECK(world.rec.spawns[2].env.at("LOCAL_RANK") == "1");
  CHECK(world.rec.spawns[2].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(world.rec.signals[0].empty());  // the survivor was never signalled
  CHECK(seen.generation == 1);
  CHECK(seen.state_after_publish == layout::kReady);
  // Only what changed: the restart count and the round, never RANK.
  const std::string blob = std::string(1, '\0') + seen.env;
  CHECK(blob.find(std::string("\0TORCHELASTIC_RESTART_COUNT=1\0", 30)) != std::string::npos);
  CHECK(blob.find(std::string("\0DDPRUN_ROUND=", 14)) != std::string::npos);
  CHECK(blob.find(std::string("\0RANK=", 6)) == std::string::npos);
  CHECK_THAT(r.err, Catch::Contains("in place: rank(s) 0 keep their processes and re-form into "
                                    "this round; started rank(s) 1"));
  CHECK_THAT(r.err, Catch::Contains("(in place: worker rank 1 exited with exit code 3)"));
}

TEST_CASE("Agent inplace: a survivor that never registered is restarted as a process, said once",
          "[unit][agent][inplace]") {
  SimWorld world;
  world.script = [](int, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(100, 0);
  };
  AgentOptions o = Options(2);
  const std::string job = o.job_id;
  auto r = RunAgent(world, o);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 4);
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});
  CHECK_THAT(r.err, Catch::Contains("ddprun: [job " + job +
                                    " round 1] in place: worker rank 0 (pid 100000) never "
                                    "registered to re-form in its process"));
}

TEST_CASE(
    "Agent inplace: a registered survivor that does not acknowledge within the deadline is "
    "restarted as a process",
    "[unit][agent][inplace]") {
  SimWorld world;
  world.script = [&](int index, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      RegistersSoon(world);
      return Runs();  // stuck: never acknowledges
    }
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(20'000, 0);
  };
  auto r = RunAgent(world, Options(2));
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 4);
  // Stuck in a call, it could not run a SIGTERM handler: SIGKILL at once.
  CHECK(world.rec.signals[0] == std::vector<int>{SIGKILL});
  CHECK(world.rec.spawns[3].env.at("LOCAL_RANK") == "0");
  CHECK(world.rec.spawns[3].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK_THAT(r.err, Catch::Contains("in place: worker rank 0 (pid 100000) did not re-form within "
                                    "10 s"));
}

// The chaos run's SDK trainer (docs/chaos.md, Findings): it registers through
// ddp::Init but ends on PeerLostError instead of calling ddp::Reconfigure.
// Its exit after it was kept into the new round belongs to the failure being
// recovered from: it is started again into the same round and spends no
// restart (before: a second restart, the first recovery "superseded").
TEST_CASE(
    "Agent inplace: a survivor that exits before acknowledging is started again into the same "
    "round, spending no restart",
    "[unit][agent][inplace]") {
  SimWorld world;
  world.script = [&](int index, int local, int restart) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      RegistersSoon(world);
      return ExitsAfter(300, 1);  // after the re-form, never acknowledged
    }
    if (restart == 0) return local == 1 ? ExitsAfter(100, 3) : Runs();
    return ExitsAfter(200, 0);
  };
  AgentOptions o = Options(2);
  o.policy.max_restarts = 1;  // a second restart would fail the job
  auto r = RunAgent(world, o);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 4);
  CHECK(world.rec.spawns[2].env.at("LOCAL_RANK") == "1");
  CHECK(world.rec.spawns[2].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(world.rec.spawns[3].env.at("LOCAL_RANK") == "0");
  CHECK(world.rec.spawns[3].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK_THAT(r.err, Catch::Contains("in place: worker rank 0 exited with exit code 1 before it "
                                    "re-formed into this round"));
  CHECK_THAT(r.err, !Catch::Contains("superseded"));
}

// Issue 29: a survivor on this node that exits (an uncaught PeerLostError,
// a collective that failed) before its agent has heard of the failure that
// caused it (here: the other node lost 5 ms later, the rendezvous' restart
// still on its way) belongs to that failure's recovery. Before, the agent
// reported it as a failure of its own: the lost node's re-form (which spends
// no restart) became "restart 1 of 1", and the job's one genuine failure
// later found the budget spent.
TEST_CASE(
    "Agent inplace: a registered survivor that exits before the rendezvous' restart reaches its "
    "agent is folded into that recovery and spends no restart",
    "[unit][agent][inplace]") {
  SimWorld world;
  AgentOptions o = ElasticOfTwo();
  o.policy.max_restarts = 1;
  std::string phantom;
  world.script = [&](int index, int, int) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      RegistersSoon(world);
      return ExitsAfter(1000, 1);  // its peer on the other node is gone
    }
    if (index == 1) {  // the next round: a failure of its own (killed)
      return Behaviour{milliseconds(500), ExitStatus{0, SIGKILL}, false};
    }
    return ExitsAfter(100, 0);
  };
  auto r = RunAgent(world, o, [&](InProcessSession& s) {
    phantom = s.PhantomJoin(o, "10.0.0.9");
    // The other node's agent is lost 5 ms after this node's worker exited.
    world.queue.After(milliseconds(1005), [&s, &phantom] { s.PhantomLost(phantom); });
  });
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  REQUIRE(world.rec.spawns.size() == 3);
  // The lost node's re-form spent nothing; the kill spent the one restart.
  CHECK(world.rec.spawns[1].env.at("TORCHELASTIC_RESTART_COUNT") == "0");
  CHECK(world.rec.spawns[2].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  // Worker rank 1: this node was node 1 of 2 in round 0.
  CHECK_THAT(r.err, Catch::Contains("in place: worker rank 1 exited with exit code 1 as the job "
                                    "restarts (agent " +
                                    phantom + " was lost); it is part of that recovery"));
  CHECK_THAT(r.err,
             Catch::Contains("recovery from round 0 (in place: agent " + phantom + " was lost)"));
  CHECK_THAT(r.err, !Catch::Contains("worker rank 1 (local rank 0) on 127.0.0.1 exited with exit "
                                     "code 1"));  // never reported as a failure
}

// The other side of the same rule: a registered worker's exit that no
// restart follows within the window is this node's failure, reported then.
TEST_CASE(
    "Agent inplace: a registered worker's own failed exit is reported once no restart comes "
    "within the window",
    "[unit][agent][inplace]") {
  SimWorld world;
  AgentOptions o = ElasticOfTwo();
  world.script = [&](int index, int, int) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      RegistersSoon(world);
      return ExitsAfter(1000, 1);
    }
    return ExitsAfter(100, 0);
  };
  // The other node never re-joins: the elastic job goes on without it.
  auto r = RunAgent(world, o, [&](InProcessSession& s) { s.PhantomJoin(o, "10.0.0.9"); });
  INFO(r.err);
  REQUIRE(world.rec.spawns.size() >= 2);
  CHECK(world.rec.spawns[1].env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK_THAT(r.err, Catch::Contains("restarting in place: worker failure on"));
}

// Issue 29: a node whose worker failed, when a hot spare takes its seat,
// becomes the spare itself. Its recovery record used to stay open until the
// job's end and then say "saw no first step"; it ends when the node finds
// the job running without it, and says why. The survivor it kept is stopped.
TEST_CASE(
    "Agent inplace: a node that becomes the hot spare ends its recovery record saying so and "
    "stops the survivors it kept",
    "[unit][agent][inplace]") {
  SimWorld world;
  AgentOptions o = Options(2);
  o.min_nodes = o.max_nodes = 2;
  world.script = [&](int index, int local, int) -> absl::StatusOr<Behaviour> {
    if (index == 0) {
      RegistersSoon(world);
      return Runs();
    }
    return local == 1 ? ExitsAfter(500, 3) : Runs();
  };
  std::string other;
  auto r = RunAgent(world, o, [&](InProcessSession& s) {
    other = s.PhantomJoin(o, "10.0.0.8");
    // A hot spare joins the running job; the other node re-joins after the
    // failure, and the spare takes this node's seat.
    world.queue.After(milliseconds(100), [&s, &o] { s.PhantomJoin(o, "10.0.0.9"); });
    world.queue.After(milliseconds(600), [&s, &o] { s.PhantomJoin(o, "10.0.0.8"); });
  });
  INFO(r.err);
  CHECK(r.rc == kExitRendezvousError);  // a spare until the join timeout
  CHECK(world.rec.signals[0] == std::vector<int>{SIGTERM});
  CHECK_THAT(r.err, Catch::Contains(
                        "recovery from round 0 (in place: worker rank 3 exited with exit code 3) "
                        "ended: this node became the hot spare, the job runs on without it: "
                        "detected +0, stopped +0\n"));
  CHECK_THAT(r.err, Catch::Contains("without this node (it is a spare now); stopping the workers "
                                    "it kept"));
  CHECK_THAT(r.err, !Catch::Contains("saw no first step"));
}

TEST_CASE("InplaceBlocks: spawn, register, break, publish, ack", "[unit][agent][inplace]") {
  InplaceBlocks blocks;
  REQUIRE(blocks.Ensure(2).ok());
  SpawnSpec spec;
  blocks.AddToSpawn(1, &spec);
  REQUIRE(spec.inherit_fds.size() == 1);
  WorkerBlock w(spec);
  CHECK(w.Get<std::uint32_t>(layout::kVersionOffset) == layout::kVersion);
  CHECK_FALSE(blocks.Registered(1, 42));
  w.Register(42);
  CHECK(blocks.Registered(1, 42));
  CHECK_FALSE(blocks.Registered(1, 43));  // another process's registration
  CHECK(blocks.Acked(1));                 // a fresh process is in the current generation
  blocks.Break(1);
  CHECK(blocks.Broken(1));
  CHECK_FALSE(blocks.Acked(1));
  CHECK(w.Get<std::uint64_t>(layout::kGenerationOffset) == 1);
  REQUIRE(blocks.Publish(1, {{"RANK", "3"}, {"MASTER_PORT", "29501"}}, 7).ok());
  CHECK(w.Get<std::uint32_t>(layout::kStateOffset) == layout::kReady);
  CHECK(w.Get<std::uint64_t>(layout::kRoundOffset) == 7);
  CHECK(w.Env() == std::string("MASTER_PORT=29501\0RANK=3\0", 25));
  w.Set<std::uint64_t>(layout::kWorkerAckOffset, 1);
  CHECK(blocks.Acked(1));
  // A blob larger than the block is refused, the block untouched.
  CHECK_FALSE(blocks.Publish(1, {{"BIG", std::string(layout::kEnvCapacity, 'x')}}, 8).ok());
  CHECK(w.Get<std::uint64_t>(layout::kRoundOffset) == 7);
  // A new process in the seat starts unregistered.
  SpawnSpec again;
  blocks.AddToSpawn(1, &again);
  CHECK_FALSE(blocks.Registered(1, 42));
  CHECK(w.Get<std::uint32_t>(layout::kStateOffset) == layout::kRunning);
}

TEST_CASE("ChangedVariables: only what was added or changed", "[unit][agent][inplace]") {
  const std::map<std::string, std::string> now{{"A", "1"}, {"B", "2"}, {"GONE", "x"}};
  const std::map<std::string, std::string> next{{"A", "1"}, {"B", "3"}, {"NEW", "4"}};
  CHECK(ChangedVariables(now, next) ==
        std::map<std::string, std::string>{{"B", "3"}, {"NEW", "4"}});
}

}  // namespace ddprun::agent
