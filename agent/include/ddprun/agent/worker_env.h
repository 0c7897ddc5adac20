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
};

// base (the agent's environment) overlaid with the worker's variables.
Env BuildWorkerEnv(const Env& base, const WorkerEnvInputs& in, int local_rank);

// Replaces the literal "${local_rank}" in each argument, as torchrun does.
std::vector<std::string> SubstituteLocalRank(const std::vector<std::string>& argv, int local_rank);

}  // namespace ddprun::agent
