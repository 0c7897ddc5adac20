// Everything the agent needs to run one node of a job. The launcher fills it
// from flags, PET_* variables and defaults (precedence: CLI > env > default).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/cpu_binding.h"
#include "ddprun/agent/gpu_numa.h"
#include "ddprun/agent/log_spec.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

// SIGTERM -> SIGKILL (--grace_period); the text is the knob's default.
inline constexpr char kDefaultGracePeriod[] = "30";
inline constexpr double kDefaultGracePeriodS = rendezvous::DefaultNumber(kDefaultGracePeriod);
inline constexpr char kDefaultRole[] = "default";
// --warm_modules: what the warm standby of in-place replacements imports
// (warm_standby.h); "none" turns the warm start off.
inline constexpr char kDefaultWarmModules[] = "torch";
inline constexpr char kWarmModulesOff[] = "none";
// --signals_to_handle's default (torchrun 2.x's).
inline constexpr char kDefaultSignalsToHandle[] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
// --log_dir that means "no log files", as torchrun compares it with os.devnull.
inline constexpr const char* kNoLogDir = "/dev/null";

enum class RendezvousMode {
  kEmbedded,  // this agent hosts the rendezvous (--standalone; one node without an endpoint)
  kRemote,    // join ddprund (or another agent's server) at the endpoint; host it there
              // when the endpoint is this machine and nobody serves it (torchrun's is_host)
  kStatic,    // torchrun's static backend: --master_addr/--master_port/--node_rank
};

struct AgentOptions {
  // Job shape.
  std::string job_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  // Restarts, join and last-call timeouts, hang handling (job_policy.h).
  // Sent in every JoinRequest; the first joiner's hold for the job.
  rendezvous::JobPolicy policy;
  std::string role = kDefaultRole;
  // Whether a node lost while the workers run is waited for (torchelastic:
  // the others re-join and wait up to the join timeout for a replacement).
  // false: this node stops its workers and exits with kExitRendezvousError at
  // once, naming the lost node (jobs that cannot take a new node, such as
  // `ddprun bench --scaling` across nodes). Not a flag.
  bool replace_lost_nodes = true;

  // Rendezvous. The launcher decides the mode once (launcher/src/cli.cc);
  // the agent only reads it. Per mode, the fields it reads and what the
  // launcher guarantees: rendezvous_session.h.
  RendezvousMode mode = RendezvousMode::kEmbedded;
  std::string rdzv_host = "127.0.0.1";
  int rdzv_port = 0;  // 0 with kEmbedded: the OS picks
  // kRemote with several ddprund replicas (docs/ha.md): every one, in the
  // user's order; rdzv_host:rdzv_port is the first. Empty with one endpoint.
  std::vector<rendezvous::HostPort> rdzv_replicas;
  std::string join_token;                            // --rdzv_conf token=...
  int node_rank = -1;                                // requested group rank, -1: any
  std::string master_addr = "127.0.0.1";             // static
  int master_port = rendezvous::kDefaultMasterPort;  // static
  std::string local_addr;  // address advertised to other nodes ("" = hostname)
  // --rdzv_conf is_host (torchrun's c10d key), kRemote with one endpoint:
  // true: this node serves the rendezvous at the endpoint's port whatever the
  // endpoint's name resolves to (a virtual IP, a load balancer); false: it
  // never does; unset: it does when the endpoint is this machine and nobody
  // answers there yet.
  std::optional<bool> is_host;
  // TLS to the rendezvous (--tls_ca/--tls_cert/--tls_key, docs/tls.md): the
  // launcher checked the files (LoadClientTls) and made the paths absolute;
  // names say where each was given. Workers get them as DDPRUN_TLS_*.
  rendezvous::TlsOptions tls;
  // The monitoring HTTP port of the rendezvous this agent hosts (dashboard,
  // /api, /metrics): 0 the OS picks, -1 (rendezvous::kDashboardOff) off.
  int dashboard_port = 0;
  // --web_config (docs/security.md): the monitoring port's TLS and basic auth,
  // a file in the exporter toolkit's format (absolute, checked by the
  // launcher); "" = plain HTTP. web_config_source names it in messages.
  std::string web_config;
  std::string web_config_source = "--web_config";

  // Workers.
  std::vector<std::string> command;  // argv of each worker, before ${local_rank} substitution
  double grace_period_s = kDefaultGracePeriodS;
  // --cpu_bind (cpu_binding.h): each worker's CPUs, planned from this node's
  // affinity mask and topology.
  CpuBind cpu_bind = CpuBind::kNone;
  // --numa_binding (gpu_numa.h): each worker on its GPU's NUMA node; the
  // launcher refuses it together with a --cpu_bind other than none.
  NumaBinding numa_binding = NumaBinding::kNone;
  // SIGTERM, SIGINT, SIGHUP and SIGQUIT always stop the node (forwarded to
  // the workers, SIGKILL after the grace period). SIGUSR1/SIGUSR2:
  //   --forward_signals lists them: forwarded to every worker's process
  //     group and the job keeps running (Slurm's pre-emption warning);
  //   else --signals_to_handle lists them: they stop the node like SIGTERM,
  //     as in torchrun 2.9+;
  //   else ignored.
  bool forward_sigusr1 = false;
  bool forward_sigusr2 = false;
  bool stop_on_sigusr1 = false;
  bool stop_on_sigusr2 = false;
  // --log_dir; empty: a temporary directory (worker_logs.h); kNoLogDir
  // ("/dev/null", as torchrun): no log files, TORCHELASTIC_ERROR_FILE="".
  std::string log_dir;
  // --virtual_local_rank (torchrun 2.10+): every worker sees LOCAL_RANK=0 and
  // CUDA_VISIBLE_DEVICES = its own entry of the agent's list (or its local
  // rank when the agent has none); the launcher checked the list is long
  // enough.
  bool virtual_local_rank = false;
  // TORCHELASTIC_SIGNALS_TO_HANDLE for the workers, as torchrun 2.9+ exports
  // it: the signals that stop the job, then the forwarded SIGUSR1/2.
  std::string signals_to_handle = kDefaultSignalsToHandle;
  LogSpec logs;  // -r/-t/--local_ranks_filter/--prefix_output (log_spec.h)
  // Extra variables for every worker (a job file's nccl: and environment:
  // settings). They override the inherited environment; ddprun's own
  // variables (RANK, MASTER_ADDR, ...) override them.
  std::map<std::string, std::string> extra_env;

  // --warm_modules (warm_standby.h): under --restart_policy=inplace with a
  // Python entrypoint, the modules (comma-separated) a standby interpreter
  // imports ahead of a replacement; kWarmModulesOff ("none"): no standby.
  std::string warm_modules = kDefaultWarmModules;

  // Monitoring (docs/monitoring-sources.md); hang detection is in policy.
  // --python_hook: ddprun's start-up hook on the workers' PYTHONPATH.
  bool python_hook = true;

  // Checkpoints in memory (docs/checkpoint.md): the largest snapshot one
  // worker may save (--ckpt_shm_limit; its default is the knob table's); 0:
  // no checkpoint memory.
  std::uint64_t ckpt_shm_limit = 0;
  // --ckpt_dir: where the agent persists committed snapshots
  // (checkpoint_persister.h); empty: memory only.
  std::string ckpt_dir;
  // --ckpt_every: save keeps steps that are multiples of it (the workers'
  // DDPRUN_CKPT_EVERY; its default is the knob table's).
  int ckpt_every = 1;
  // --ckpt_replicas is job-wide: policy.ckpt_replicas.
  // --ckpt_bandwidth: bytes per second of the background checkpoint I/O
  // (the --ckpt_dir persister's writes, the replica sender's sends;
  // bandwidth_limit.h); 0: no limit. Its default is the knob table's.
  std::uint64_t ckpt_bandwidth = 0;
};

}  // namespace ddprun::agent
