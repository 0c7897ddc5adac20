// The agent over its real seams: the gRPC rendezvous session (embedded
// server on loopback, port 0) and the Boost launcher with trivial children.
// The loop's decisions are unit-tested in simulated time
// (tests/unit/agent/agent_test.cc); this checks the wiring.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ddprun/agent/agent.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "support/capture_stderr.h"

namespace ddprun::agent {
namespace {

using SteadyClock = std::chrono::steady_clock;

using ::ddprun::test::CaptureStderr;

AgentOptions Options(int nproc) {
  AgentOptions o;
  o.job_id = "g" + std::to_string(::getpid());
  o.mode = RendezvousMode::kEmbedded;
  o.rdzv_host = "127.0.0.1";
  o.rdzv_port = 0;
  o.nproc_per_node = nproc;
  o.policy.join_timeout_s = 10;
  o.grace_period_s = 2;
  return o;
}

struct Result {
  int rc;
  double seconds;
  std::string err;
};

Result RunAgent(AgentOptions o) {
  BlockAgentSignals();
  CaptureStderr cap;
  const auto t0 = SteadyClock::now();
  int rc;
  {
    Agent agent(std::move(o), MakeBoostProcessLauncher());
    rc = agent.Run();
  }
  return Result{rc, std::chrono::duration<double>(SteadyClock::now() - t0).count(), cap.text()};
}

TEST_CASE("Agent over gRPC: embedded rendezvous, workers see their ranks, exit 0",
          "[integration]") {
  AgentOptions o = Options(2);
  o.command = {"sh", "-c",
               "test \"$LOCAL_RANK\" = ${local_rank} && test \"$WORLD_SIZE\" = 2 && "
               "test \"$MASTER_PORT\" -gt 0 && test -n \"$DDPRUN_TOKEN\" && "
               "case \"$DDPRUN_STORE_ADDR\" in 127.0.0.1:*) exit 0;; esac; exit 9"};
  auto r = RunAgent(o);
  INFO(r.err);
  CHECK(r.rc == kExitSuccess);
  CHECK(r.seconds < 10);
}

TEST_CASE("Agent over gRPC: a worker failure beyond the budget is exit 1 with the report",
          "[integration]") {
  AgentOptions o = Options(1);
  o.command = {"sh", "-c", "exit 7"};
  auto r = RunAgent(o);
  INFO(r.err);
  CHECK(r.rc == kExitWorkerFailed);
  CHECK(r.err.find("ddprun: job " + o.job_id +
                   " failed: worker rank 0 (local rank 0) on "
                   "127.0.0.1 exited with exit code 7") != std::string::npos);
}

TEST_CASE("Agent: an unreachable rendezvous is a one-line error within the join timeout",
          "[integration]") {
  AgentOptions o = Options(1);
  o.mode = RendezvousMode::kRemote;
  o.rdzv_host = "192.0.2.1";  // TEST-NET-1: never this machine
  o.rdzv_port = 29400;
  o.policy.join_timeout_s = 1;
  o.command = {"true"};
  auto r = RunAgent(o);
  INFO(r.err);
  CHECK(r.rc == kExitRendezvousError);
  CHECK(r.seconds < 5);
  CHECK(r.err.find("cannot reach the rendezvous at 192.0.2.1:29400") != std::string::npos);
}

}  // namespace
}  // namespace ddprun::agent
