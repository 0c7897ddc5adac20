// The environment each worker gets: torchrun's contract, verbatim, plus the
// DDPRUN_* variables the worker SDK reads (their names:
// rendezvous/worker_env_names.h). A pure function, unit-tested.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

using Env = std::map<std::string, std::string>;

// torch 2.5+'s opt-out of the shared store: "1" makes worker rank 0 host the
// TCPStore at MASTER_ADDR:MASTER_PORT instead of the agent (torchrun's
// dynamic_rendezvous `use_agent_store`).
inline constexpr const char* kEnvDisableSharedStore = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE";

// Whether the workers host their own TCPStore, as torchrun decides it: the
// agent's `base` environment has TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and the
// rendezvous is c10d's (torchrun's static backend always shares its store).
bool WorkersHostStore(const Env& base, RendezvousMode mode);

// The agent's own environment, as a map.
Env CurrentEnvironment();

struct WorkerEnvInputs {
  const AgentOptions* options = nullptr;
  const rendezvous::Assignment* assignment = nullptr;
  std::string store_endpoint;  // host:port of the gRPC Store for DDPRUN_STORE_ADDR
  std::string tcp_store;       // DDPRUN_TCPSTORE_ADDR ("": unset, the SDK uses the gRPC Store)
  std::string error_file;      // TORCHELASTIC_ERROR_FILE ("" when no log dir)
  std::string host;            // this node's advertised address
  // TORCHELASTIC_TIMER_FILE: the FIFO of the agent's file timer
  // (file_timer.h); "": no timer served, an inherited value passes through.
  std::string timer_file;
  // TORCHELASTIC_USE_AGENT_STORE: true, the agent's store is at
  // MASTER_ADDR:MASTER_PORT; false (WorkersHostStore), worker rank 0 hosts it
  // on that free port of group rank 0's node.
  bool agent_store = true;
};

// base (the agent's environment) overlaid with the worker's variables.
Env BuildWorkerEnv(const Env& base, const WorkerEnvInputs& in, int local_rank);

// Replaces the literal "${local_rank}" in each argument, as torchrun does.
std::vector<std::string> SubstituteLocalRank(const std::vector<std::string>& argv, int local_rank);

}  // namespace ddprun::agent
