#include "ddprun/agent/worker_env.h"

#include <string_view>

#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/worker_env_names.h"

extern char** environ;

namespace ddprun::agent {

Env CurrentEnvironment() {
  Env env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

bool WorkersHostStore(const Env& base, RendezvousMode mode) {
  auto it = base.find(kEnvDisableSharedStore);
  return mode != RendezvousMode::kStatic && it != base.end() && it->second == "1";
}

Env BuildWorkerEnv(const Env& base, const WorkerEnvInputs& in, int local_rank) {
  const AgentOptions& opt = *in.options;
  const rendezvous::Assignment& a = *in.assignment;
  Env env = base;
  for (const auto& [key, value] : opt.extra_env) env[key] = value;
  auto set = [&env](const char* key, const std::string& value) { env[key] = value; };
  auto set_default = [&env](const char* key, const std::string& value) {
    env.emplace(key, value);  // keeps an inherited value
  };
  const int rank = a.base_rank + local_rank;

  // torchrun's contract.
  set("LOCAL_RANK", opt.virtual_local_rank ? std::string("0") : std::to_string(local_rank));
  if (opt.virtual_local_rank) {
    // As torchrun 2.10+: the worker's own entry of the agent's list (the
    // launcher checked it has one per local rank), else its local rank.
    std::string device = std::to_string(local_rank);
    if (auto it = base.find("CUDA_VISIBLE_DEVICES"); it != base.end()) {
      std::string_view list = it->second;
      for (int i = 0; i < local_rank && !list.empty(); ++i) {
        const std::size_t comma = list.find(',');
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
      device = std::string(list.substr(0, list.find(',')));
    }
    set("CUDA_VISIBLE_DEVICES", device);
  }
  set("RANK", std::to_string(rank));
  set("GROUP_RANK", std::to_string(a.group_rank));
  set("ROLE_RANK", std::to_string(rank));  // one role per job
  set("ROLE_NAME", opt.role);
  set("LOCAL_WORLD_SIZE", std::to_string(a.local_world_size));
  set("WORLD_SIZE", std::to_string(a.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(a.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(a.world_size));
  set("MASTER_ADDR", a.master_addr);
  set("MASTER_PORT", std::to_string(a.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(a.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt.policy.max_restarts));
  set("TORCHELASTIC_RUN_ID", opt.job_id);
  // True: the group-rank-0 agent already serves a TCPStore at
  // MASTER_ADDR:MASTER_PORT; False: worker rank 0 binds it there.
  set("TORCHELASTIC_USE_AGENT_STORE", in.agent_store ? "True" : "False");
  if (!in.error_file.empty()) {
    set("TORCHELASTIC_ERROR_FILE", in.error_file);
  } else if (opt.log_dir == kNoLogDir) {
    set("TORCHELASTIC_ERROR_FILE", "");  // as torchrun with --log-dir /dev/null
  } else {
    env.erase("TORCHELASTIC_ERROR_FILE");  // never the agent's own error file
  }
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", opt.signals_to_handle);
  if (!in.timer_file.empty()) set("TORCHELASTIC_TIMER_FILE", in.timer_file);
  if (a.local_world_size > 1) set_default("OMP_NUM_THREADS", "1");
  // As torchrun 2.2+. Not the old name (NCCL_ASYNC_ERROR_HANDLING, torch <=
  // 2.1): torch 2.x warns on every rank when it is set (seen with 2.11 on a
  // GPU); an inherited value of either passes through.
  set_default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");

  // ddprun's own, for the worker SDK.
  set(kEnvStoreAddr, in.store_endpoint);
  if (!opt.rdzv_replicas.empty()) {
    std::string list;
    for (const auto& hp : opt.rdzv_replicas) {
      if (!list.empty()) list += ",";
      list += rendezvous::FormatHostPort(hp);
    }
    set(kEnvStoreReplicas, list);
  } else {
    env.erase(kEnvStoreReplicas);  // never an outer job's list
  }
  set(kEnvJobId, a.job_id.empty() ? opt.job_id : a.job_id);
  set(kEnvRound, std::to_string(a.round));
  set(kEnvToken, a.store_token);
  set(kEnvHost, in.host);
  // The agent's TLS files, never ones inherited from its own environment.
  auto set_or_erase = [&env](const char* key, const std::string& value) {
    if (value.empty()) {
      env.erase(key);
    } else {
      env[key] = value;
    }
  };
  set_or_erase(kEnvTlsCa, opt.tls.ca_file);
  set_or_erase(kEnvTlsCert, opt.tls.cert_file);
  set_or_erase(kEnvTlsKey, opt.tls.key_file);
  // Which store the SDK bootstraps through: set by the session, never inherited.
  set_or_erase(kEnvTcpStoreAddr, in.tcp_store);
  return env;
}

std::vector<std::string> SubstituteLocalRank(const std::vector<std::string>& argv, int local_rank) {
  static constexpr std::string_view kPattern = "${local_rank}";
  const std::string value = std::to_string(local_rank);
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (const std::string& arg : argv) {
    std::string s = arg;
    for (std::size_t pos = s.find(kPattern); pos != std::string::npos;
         pos = s.find(kPattern, pos + value.size())) {
      s.replace(pos, kPattern.size(), value);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ddprun::agent
