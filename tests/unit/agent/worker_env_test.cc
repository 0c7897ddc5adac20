// The worker environment: torchrun's variables, ddprun's, and the rules for
// inherited values.
#include "ddprun/agent/worker_env.h"

#include <catch2/catch.hpp>
#include <cstdlib>

#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::agent {
namespace {

struct Fixture {
  AgentOptions options;
  rendezvous::Assignment assignment;
  WorkerEnvInputs in;

  Fixture() {
    options.job_id = "job42";
    options.nproc_per_node = 2;
    options.policy.max_restarts = 3;
    options.role = "trainer";
    assignment.job_id = "job42";
    assignment.round = 5;
    assignment.group_rank = 1;
    assignment.group_world_size = 2;
    assignment.base_rank = 2;
    assignment.world_size = 4;
    assignment.local_world_size = 2;
    assignment.master_addr = "10.0.0.1";
    assignment.master_port = 40001;
    assignment.restart_count = 2;
    assignment.store_token = "tok";
    in.options = &options;
    in.assignment = &assignment;
    in.store_endpoint = "10.0.0.1:29400";
    in.error_file = "/logs/job42/attempt_2/1/error.json";
    in.host = "10.0.0.2";
  }
};

TEST_CASE("BuildWorkerEnv sets every torchrun and ddprun variable", "[unit]") {
  Fixture f;
  Env env = BuildWorkerEnv({}, f.in, 1);
  CHECK(env.at("RANK") == "3");  // base_rank + local_rank
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "4");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("ROLE_NAME") == "trainer");
  CHECK(env.at("ROLE_RANK") == "3");
  CHECK(env.at("ROLE_WORLD_SIZE") == "4");
  CHECK(env.at("MASTER_ADDR") == "10.0.0.1");
  CHECK(env.at("MASTER_PORT") == "40001");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job42");
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/logs/job42/attempt_2/1/error.json");
  CHECK(env.at("OMP_NUM_THREADS") == "1");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(env.count("NCCL_ASYNC_ERROR_HANDLING") == 0);  // torch 2.x warns on the old name
  CHECK(env.at(kEnvStoreAddr) == "10.0.0.1:29400");
  CHECK(env.at(kEnvJobId) == "job42");
  CHECK(env.at(kEnvRound) == "5");
  CHECK(env.at(kEnvToken) == "tok");
  CHECK(env.at(kEnvHost) == "10.0.0.2");
}

TEST_CASE("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: worker rank 0 hosts the store (c10d only)",
          "[unit]") {
  const Env off = {{kEnvDisableSharedStore, "1"}};
  CHECK(WorkersHostStore(off, RendezvousMode::kEmbedded));
  CHECK(WorkersHostStore(off, RendezvousMode::kRemote));
  // torchrun's static backend always shares the agent's store.
  CHECK_FALSE(WorkersHostStore(off, RendezvousMode::kStatic));
  // Only "1", as torch's `!= "1"` test.
  CHECK_FALSE(WorkersHostStore({{kEnvDisableSharedStore, "0"}}, RendezvousMode::kEmbedded));
  CHECK_FALSE(WorkersHostStore({{kEnvDisableSharedStore, "true"}}, RendezvousMode::kEmbedded));
  CHECK_FALSE(WorkersHostStore({}, RendezvousMode::kEmbedded));
  Fixture f;
  f.in.agent_store = false;
  // An inherited value never decides it.
  Env env = BuildWorkerEnv({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}, f.in, 0);
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(env.at("MASTER_PORT") == "40001");
}

TEST_CASE("BuildWorkerEnv: replicas are passed in DDPRUN_STORE_REPLICAS, never inherited",
          "[unit]") {
  Fixture f;
  // One daemon: none, even when the agent itself ran inside another job.
  CHECK(BuildWorkerEnv({{kEnvStoreReplicas, "old:1,old:2"}}, f.in, 0).count(kEnvStoreReplicas) ==
        0);
  f.options.rdzv_replicas = {{"d1", 29400}, {"::1", 29401}};
  Env env = BuildWorkerEnv({{kEnvStoreReplicas, "old:1"}}, f.in, 0);
  CHECK(env.at(kEnvStoreReplicas) == "d1:29400,[::1]:29401");
  CHECK(env.at(kEnvStoreAddr) == "10.0.0.1:29400");  // the one the agent joined through
}

TEST_CASE("BuildWorkerEnv: DDPRUN_TCPSTORE_ADDR only when the session names a TCPStore", "[unit]") {
  Fixture f;
  // The gRPC Store (several nodes, TLS, ddprund): unset, also when inherited
  // from an outer job.
  CHECK(BuildWorkerEnv({{kEnvTcpStoreAddr, "127.0.0.1:1"}}, f.in, 0).count(kEnvTcpStoreAddr) == 0);
  f.in.tcp_store = "127.0.0.1:40001";
  Env env = BuildWorkerEnv({{kEnvTcpStoreAddr, "127.0.0.1:1"}}, f.in, 0);
  CHECK(env.at(kEnvTcpStoreAddr) == "127.0.0.1:40001");
  CHECK(env.at(kEnvStoreAddr) == "10.0.0.1:29400");  // still there: ddprun status, top
}

TEST_CASE("BuildWorkerEnv: RANK is base rank plus local rank for each local rank", "[unit]") {
  Fixture f;
  f.assignment.base_rank = 8;
  f.assignment.local_world_size = 4;
  f.assignment.world_size = 16;
  for (int j = 0; j < 4; ++j) {
    Env env = BuildWorkerEnv({}, f.in, j);
    CHECK(env.at("RANK") == std::to_string(8 + j));
    CHECK(env.at("LOCAL_RANK") == std::to_string(j));
  }
}

TEST_CASE("BuildWorkerEnv inherits the agent's environment and overrides its variables", "[unit]") {
  Fixture f;
  Env base = {
      {"PATH", "/usr/bin"}, {"CUDA_VISIBLE_DEVICES", "0,1"}, {"RANK", "99"}, {"MASTER_PORT", "1"}};
  Env env = BuildWorkerEnv(base, f.in, 0);
  CHECK(env.at("PATH") == "/usr/bin");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "0,1");
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("MASTER_PORT") == "40001");
}

TEST_CASE("BuildWorkerEnv: OMP_NUM_THREADS rules", "[unit]") {
  Fixture f;
  SECTION("unset and nproc > 1: 1") {
    CHECK(BuildWorkerEnv({}, f.in, 0).at("OMP_NUM_THREADS") == "1");
  }
  SECTION("inherited: kept") {
    CHECK(BuildWorkerEnv({{"OMP_NUM_THREADS", "8"}}, f.in, 0).at("OMP_NUM_THREADS") == "8");
  }
  SECTION("unset and one worker per node: left unset") {
    f.assignment.local_world_size = 1;
    CHECK(BuildWorkerEnv({}, f.in, 0).count("OMP_NUM_THREADS") == 0);
  }
}

TEST_CASE("BuildWorkerEnv keeps inherited NCCL error handling settings", "[unit]") {
  Fixture f;
  Env env = BuildWorkerEnv(
      {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}, {"NCCL_ASYNC_ERROR_HANDLING", "3"}}, f.in, 0);
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "3");
}

TEST_CASE("BuildWorkerEnv without a log dir drops an inherited error file", "[unit]") {
  Fixture f;
  f.in.error_file.clear();
  Env env = BuildWorkerEnv({{"TORCHELASTIC_ERROR_FILE", "/agent/own.json"}}, f.in, 0);
  CHECK(env.count("TORCHELASTIC_ERROR_FILE") == 0);
}

// As torch 2.11's torchrun does (its workers' environments were recorded on a
// GPU machine: tests/gpu/torchrun_side_by_side.py, docs/gpu.md).
TEST_CASE("BuildWorkerEnv: --log_dir /dev/null gives an empty TORCHELASTIC_ERROR_FILE", "[unit]") {
  Fixture f;
  f.in.error_file.clear();
  f.options.log_dir = kNoLogDir;
  Env env = BuildWorkerEnv({{"TORCHELASTIC_ERROR_FILE", "/agent/own.json"}}, f.in, 0);
  CHECK(env.at("TORCHELASTIC_ERROR_FILE").empty());
}

TEST_CASE("BuildWorkerEnv: TORCHELASTIC_SIGNALS_TO_HANDLE", "[unit]") {
  Fixture f;
  CHECK(BuildWorkerEnv({}, f.in, 0).at("TORCHELASTIC_SIGNALS_TO_HANDLE") ==
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  f.options.signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1";
  CHECK(BuildWorkerEnv({{"TORCHELASTIC_SIGNALS_TO_HANDLE", "x"}}, f.in, 0)
            .at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1");
}

TEST_CASE("BuildWorkerEnv: --virtual_local_rank", "[unit]") {
  Fixture f;
  f.options.virtual_local_rank = true;
  // No list: each worker's device is its local rank; LOCAL_RANK is 0, RANK unchanged.
  Env e1 = BuildWorkerEnv({}, f.in, 1);
  CHECK(e1.at("LOCAL_RANK") == "0");
  CHECK(e1.at("RANK") == "3");
  CHECK(e1.at("CUDA_VISIBLE_DEVICES") == "1");
  // The agent's list: the worker's own entry.
  const Env base = {{"CUDA_VISIBLE_DEVICES", "5,7"}};
  CHECK(BuildWorkerEnv(base, f.in, 0).at("CUDA_VISIBLE_DEVICES") == "5");
  CHECK(BuildWorkerEnv(base, f.in, 1).at("CUDA_VISIBLE_DEVICES") == "7");
  CHECK(BuildWorkerEnv({{"CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c"}}, f.in, 2)
            .at("CUDA_VISIBLE_DEVICES") == "GPU-c");
  // Off: the list passes through and LOCAL_RANK is the local rank.
  f.options.virtual_local_rank = false;
  Env off = BuildWorkerEnv(base, f.in, 1);
  CHECK(off.at("LOCAL_RANK") == "1");
  CHECK(off.at("CUDA_VISIBLE_DEVICES") == "5,7");
}

TEST_CASE("BuildWorkerEnv applies extra_env (a job file's nccl/environment) below its own",
          "[unit]") {
  Fixture f;
  f.options.extra_env = {{"NCCL_SOCKET_IFNAME", "eth0"},
                         {"NCCL_DEBUG", "WARN"},
                         {"OMP_NUM_THREADS", "8"},
                         {"RANK", "99"}};
  Env env = BuildWorkerEnv({{"NCCL_DEBUG", "INFO"}, {"HOME", "/root"}}, f.in, 0);
  CHECK(env.at("NCCL_SOCKET_IFNAME") == "eth0");
  CHECK(env.at("NCCL_DEBUG") == "WARN");    // over the inherited value
  CHECK(env.at("OMP_NUM_THREADS") == "8");  // not forced to 1 when given
  CHECK(env.at("RANK") == "2");             // ddprun's own variables win
  CHECK(env.at("HOME") == "/root");
}

TEST_CASE("SubstituteLocalRank replaces every ${local_rank}", "[unit]") {
  std::vector<std::string> argv = {
      "train",         "--gpu=${local_rank}", "x${local_rank}y${local_rank}",
      "${local_rank}", "$local_rank",         "plain"};
  std::vector<std::string> out = SubstituteLocalRank(argv, 12);
  CHECK(out ==
        std::vector<std::string>{"train", "--gpu=12", "x12y12", "12", "$local_rank", "plain"});
}

TEST_CASE("CurrentEnvironment reflects the process environment", "[unit]") {
  ::setenv("DDPRUN_TEST_VAR", "a=b=c", 1);
  Env env = CurrentEnvironment();
  CHECK(env.at("DDPRUN_TEST_VAR") == "a=b=c");  // split at the first '='
  ::unsetenv("DDPRUN_TEST_VAR");
  CHECK(CurrentEnvironment().count("DDPRUN_TEST_VAR") == 0);
}

}  // namespace
}  // namespace ddprun::agent

namespace ddprun::agent {
namespace {

TEST_CASE("BuildWorkerEnv: TORCHELASTIC_TIMER_FILE when the agent serves the file timer",
          "[unit]") {
  Fixture f;
  Env base = {{"TORCHELASTIC_TIMER_FILE", "/outer"}};
  CHECK(BuildWorkerEnv(base, f.in, 0).at("TORCHELASTIC_TIMER_FILE") == "/outer");
  f.in.timer_file = "/tmp/watchdog_timer_x";
  CHECK(BuildWorkerEnv(base, f.in, 0).at("TORCHELASTIC_TIMER_FILE") == "/tmp/watchdog_timer_x");
}

}  // namespace
}  // namespace ddprun::agent
