// The environment each worker gets: torchrun's contract, verbatim, plus the
// DDPRUN_* variables the worker SDK reads. A pure function, unit-tested.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.h"
#include "ddprun/rendezvous/types.h"

namespace ddprun::agent {

using Env = std::map<std::string, std::string>;

// Names of the DDPRUN_* variables (documented in docs/cli.md).
inline constexpr const char* kEnvStoreAddr = "DDPRUN_STORE_ADDR";    // host:port of the gRPC Store
inline constexpr const char* kEnvJobId = "DDPRUN_JOB_ID";
inline constexpr const char* kEnvRound = "DDPRUN_ROUND";
inline constexpr const char* kEnvToken = "DDPRUN_TOKEN";
inline constexpr const char* kEnvHost = "DDPRUN_HOST";

// The agent's own environment, as a map.
Env CurrentEnvironment();

struct WorkerEnvInputs {
  const AgentOptions* options = nullptr;
  const rendezvous::Assignment* assignment = nullptr;
  std::string store_endpoint;  // host:port of the gRPC Store for DDPRUN_STORE_ADDR
  std::string error_file;      // TORCHELASTIC_ERROR_FILE ("" when no log dir)
  std::string host;            // this node's advertised address
};

// base (the agent's environment) overlaid with the worker's variables.
Env BuildWorkerEnv(const Env& base, const WorkerEnvInputs& in, int local_rank);

// Replaces the literal "${local_rank}" in each argument, as torchrun does.
std::vector<std::string> SubstituteLocalRank(const std::vector<std::string>& argv, int local_rank);

}  // namespace ddprun::agent
