// ddp::Reconfigure with real processes, the agent played by this test: four
// sdk_worker ranks on the round's TCPStore (C10dStoreServer, as ddprun runs
// it for a one-node job), each with its in-place control block
// (support/inplace_agent_block.h). Rank 2 is killed with SIGKILL while the
// others all-reduce; the test then does what the agent does under
// --restart_policy=inplace (docs/recovery.md): breaks the survivors' blocks,
// writes round 1's job key, publishes round 1's environment and starts a
// replacement rank 2 in round 1. The survivors must fail with PeerLostError
// naming rank 2, re-form in their own processes (same pids), acknowledge
// generation 1, and all-reduce with the replacement in round 1; on both CPU
// transports. ddprun's own in-place agent is exercised by inplace_sdk_test.cc.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "ddprun/rendezvous/store/sdk_store_scope.h"
#include "support/inplace_agent_block.h"
#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

constexpr int kWorld = 4;
constexpr int kVictim = 2;
const std::string kJob = "reform-job";
const std::string kToken = "reform-token-0123456789abcdef";

// The variables ddprun sets that change between rounds, for rank r of `round`.
EnvList RoundEnv(int r, int round, const std::string& store) {
  return {{"RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(kWorld)},
          {"LOCAL_RANK", std::to_string(r)},
          {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
          {ddprun::kEnvRound, std::to_string(round)},
          {ddprun::kEnvTcpStoreAddr, store},
          {ddprun::kEnvStoreAddr, store}};
}

EnvList Join(EnvList a, const EnvList& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("Reconfigure: survivors of a kill -9 re-form in their own processes with a replacement",
          "[sdk]") {
  for (const char* shm : {"1", "0"}) {
    DYNAMIC_SECTION((std::string(shm) == "1" ? "shm" : "tcp")) {
      Harness h;
      auto server = ddprun::rendezvous::C10dStoreServer::Start({"127.0.0.1", 0});
      REQUIRE(server.ok());
      const std::string store = "127.0.0.1:" + std::to_string((*server)->port());
      for (int round : {0, 1}) {
        REQUIRE(
            (*server)->engine().Set(ddprun::rendezvous::SdkStoreJobKey(kToken, round), kJob).ok());
      }
      const std::string out = h.dir() + "/result";
      const EnvList common = {{ddprun::kEnvJobId, kJob},       {ddprun::kEnvToken, kToken},
                              {ddprun::kEnvHost, "127.0.0.1"}, {"DDP_SHM", shm},
                              {"DDP_TIMEOUT_SEC", "30"},       {"DDPRUN_DEBUG", "sdk"},
                              {"SDK_RESULT_FILE", out}};
      std::vector<std::unique_ptr<AgentBlock>> blocks;
      std::vector<Proc*> procs;
      for (int r = 0; r < kWorld; ++r) {
        blocks.push_back(std::make_unique<AgentBlock>());
        EnvList env = Join(common, RoundEnv(r, 0, store));
        env.push_back(blocks[r]->EnvEntry());
        procs.push_back(
            &h.Start("rank" + std::to_string(r), CatchRun(Bin("sdk_worker"), "[reform]"), env));
      }
      // Every rank is in its all-reduce loop.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (int r = 0; r < kWorld; ++r) {
        while (ReadFile(out + ".ready." + std::to_string(r)).empty()) {
          INFO("rank " << r << " never started: " << ReadFile(procs[r]->err_path));
          REQUIRE(std::chrono::steady_clock::now() < deadline);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      // Every rank registered: its pid and the can-re-form flag.
      for (int r = 0; r < kWorld; ++r) {
        REQUIRE(blocks[r]->At<std::uint32_t>(layout::kWorkerPidOffset).load() ==
                static_cast<std::uint32_t>(procs[r]->pid));
        REQUIRE((blocks[r]->At<std::uint32_t>(layout::kWorkerFlagsOffset).load() &
                 layout::kFlagCanReform));
      }
      std::ofstream(out + ".killed") << MonotonicNs() << "\n";
      REQUIRE(::kill(procs[kVictim]->pid, SIGKILL) == 0);
      REQUIRE(h.Wait(*procs[kVictim], 30) != 0);
      // The agent's part: break the survivors' blocks, start the
      // replacement in round 1, and once it is ready (in ddp::Init: its
      // hello key is in round 1's store) publish round 1 to the survivors,
      // so that their formed_ms is the re-form after the replacement is
      // ready (bench/sdk_recovery.sh reads the printed figures).
      for (int r = 0; r < kWorld; ++r) {
        if (r != kVictim) blocks[r]->Break();
      }
      auto fresh = std::make_unique<AgentBlock>();
      EnvList env = Join(common, RoundEnv(kVictim, 1, store));
      env.push_back(fresh->EnvEntry());
      Proc& replacement = h.Start("replacement", CatchRun(Bin("sdk_worker"), "[reform]"), env);
      const std::string hello = ddprun::rendezvous::SdkStoreScope(kToken, 1) + "/ddp/pg0/hello/" +
                                std::to_string(kVictim);
      while (!(*server)->engine().Get(hello)) {
        INFO("the replacement never reached ddp::Init: " << replacement.Err());
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (int r = 0; r < kWorld; ++r) {
        if (r == kVictim) continue;
        EnvList round1 = RoundEnv(r, 1, store);
        blocks[r]->Publish(
            std::vector<std::pair<std::string, std::string>>(round1.begin(), round1.end()), 1);
      }
      for (int r = 0; r < kWorld; ++r) {
        Proc& p = r == kVictim ? replacement : *procs[r];
        INFO("rank " << r << " stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
        REQUIRE(h.Wait(p, 90) == 0);
      }
      for (int r = 0; r < kWorld; ++r) {
        const std::string report = ReadFile(out + "." + std::to_string(r));
        INFO("rank " << r << ": " << report);
        const pid_t pid = r == kVictim ? replacement.pid : procs[r]->pid;
        REQUIRE(report.find("pid=" + std::to_string(pid) + " ") == 0);  // survivors kept theirs
        REQUIRE(report.find(" round=1 size=4 sum=10 ") != std::string::npos);
        if (r != kVictim) {
          REQUIRE(report.find("lost=2 lost_ms=") != std::string::npos);
          const double lost_ms = std::stod(report.substr(report.find("lost_ms=") + 8));
          std::printf("re-form (%s): rank %d's PeerLostError %.1f ms after the kill\n",
                      std::string(shm) == "1" ? "shm" : "tcp", r, lost_ms);
          REQUIRE(lost_ms < 2000);
          const std::string err = ReadFile(procs[r]->err_path);
          const std::size_t at = err.find("formed_ms=");
          INFO("stderr: " << err);
          REQUIRE(at != std::string::npos);
          std::printf("re-form (%s): rank %d formed round 1's group %.1f ms after it was ready\n",
                      std::string(shm) == "1" ? "shm" : "tcp", r, std::stod(err.substr(at + 10)));
          REQUIRE(blocks[r]->At<std::uint64_t>(layout::kWorkerAckOffset).load() == 1);
        }
      }
    }
  }
}
