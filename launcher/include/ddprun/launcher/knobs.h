// The launcher's knobs, each defined once (like Ray's RAY_CONFIG table or
// NCCL's NCCL_PARAM): its flag (--flag_name, and --flag-name follows), its
// PET_<FLAG_NAME> variable, its key in a job file, its default, its --help
// text and group, and the type whose parser (value_parsers.h) checks it.
//
// Everything else derives from this table: the CLI11 flags and --help
// (flag_table.cc), the keys a job file accepts and how each value is checked
// (job_config.cc), --print-config's lines (print_config.cc), and a unit test
// that docs/cli.md and docs/config.md show every knob with this default.
//
// Precedence, stated once: flag > PET_<FLAG> > job file > default. A few
// knobs have a second variable (TORCH_ELASTIC_SHUTDOWN_TIMEOUT for
// --grace_period), handled where the value is resolved (resolve_options.cc).
//
// To add a knob: one entry here (in the order --print-config and the file's
// "valid keys" messages show) naming its field (.dest; a job-wide one is a
// JobPolicy field, job_policy.h), or else its use in resolve_options.cc; a
// row in docs/cli.md (and docs/config.md when it has a YAML key).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "ddprun/launcher/knob_dest.h"

namespace ddprun::launcher {

// How a knob's text is checked and normalised (value_parsers.h has one
// parser per type; the command line and the job file both use it).
enum class ValueType {
  kNodeRange,        // N or MIN:MAX, 0 < MIN <= MAX
  kNproc,            // N, cpu, gpu, xpu or auto
  kCount,            // an integer in [min, max]
  kSeconds,          // a number of seconds >= 0
  kPositiveSeconds,  // a number of seconds > 0
  kStreams,          // torchrun's Std: 0-3, or RANK:V,...
  kRankList,         // RANK,... (local ranks)
  kEndpoint,         // HOST[:PORT]; IPv6 in brackets (first_node[:PORT] in placement)
  kPort,             // 1..65535
  kPortOrOff,        // 0..65535 (0: the OS picks) or off
  kBool,             // on/off: a presence flag; PET_ and the file give true/false
  kText,             // any non-empty text
  kToken,            // non-empty text without ','
  kJobId,            // job_id.h's rule
  kBackend,          // c10d, ddprun (alias) or static
  kSignals,          // SIG,... of the forwarded set
  kStartMethod,      // spawn, fork or forkserver
  kOnHang,           // report, restart or abort
  kRestartPolicy,    // job or inplace
  kCpuBind,          // auto, none, core or numa (agent/cpu_binding.h)
  kScheduler,        // auto, slurm, mpi or none (placement.h)
  kBytes,            // N[K|M|G|T][iB|B]: a number of bytes, binary multiples
  kRdzvConf,         // KEY=VALUE,... (each key is its own knob below)
  kFileOnly,         // a job-file structure parsed by job_config.cc (hosts, command, ...)
};

// Groups of --help, in display order.
inline constexpr const char* kGroupJob = "Job shape";
inline constexpr const char* kGroupRdzv = "Rendezvous (c10d: ddprund or embedded)";
inline constexpr const char* kGroupStatic = "Static rendezvous (--rdzv_backend=static)";
inline constexpr const char* kGroupCommand = "Worker command";
inline constexpr const char* kGroupOutput = "Worker output and logs";
inline constexpr const char* kGroupCompat = "Accepted for torchrun compatibility";
inline constexpr const char* kGroupConfig = "Job file (docs/config.md)";
inline constexpr const char* kGroupMonitoring = "Monitoring (docs/monitoring.md)";
inline constexpr const char* kHelpGroups[] = {kGroupJob,     kGroupRdzv,   kGroupStatic,
                                              kGroupCommand, kGroupOutput, kGroupMonitoring,
                                              kGroupCompat,  kGroupConfig};

struct Knob {
  // The flag's underscore name ("nproc_per_node"); nullptr for a job-file
  // key without a flag, or a key of --rdzv_conf (then `rdzv_conf` is set).
  const char* name = nullptr;
  const char* short_flag = nullptr;  // "r" for -r, or nullptr
  const char* rdzv_conf = nullptr;   // the --rdzv_conf key this entry stands for
  const char* yaml_key = nullptr;    // nullptr: command line only (the file is shared by nodes)
  ValueType type = ValueType::kText;
  // What the parser gets when nothing sets the knob; nullptr: unset (the
  // resolution decides, e.g. a random job id for a single node).
  const char* default_value = nullptr;
  const char* default_text = "none";  // as --help, --print-config and the docs show the default
  const char* metavar = nullptr;      // "N|MIN:MAX"; nullptr for on/off flags
  const char* group = nullptr;        // kGroup*; nullptr: not a flag
  const char* help = "";
  long min = 0, max = 0;  // kCount bounds
  const char* what =
      "";  // kCount: what a good value is, for messages ("a number of lines in 0..10000")
  // Where resolution stores the parsed value (knob_dest.h); none: the
  // value spans several knobs or fields, and resolve_options.cc resolves it.
  // A job-wide setting goes to the agent's JobPolicy (kInPolicy), whose
  // field holds the default the row's default_value must parse to.
  KnobDest dest = {};

  bool is_flag() const { return name != nullptr; }
  // The key resolved values are stored under: the flag name, or
  // "rdzv_conf.<key>" for a key of --rdzv_conf.
  std::string Dest() const;
};

// clang-format off
inline constexpr Knob kKnobs[] = {
    // Job id and rendezvous.
    {.name = "rdzv_id", .yaml_key = "job.id", .type = ValueType::kJobId,
     .default_value = "none", .default_text = "none", .metavar = "ID", .group = kGroupRdzv,
     .help = "Job id shared by every node of the job (TORCHELASTIC_RUN_ID); a random one when "
             "single-node without --rdzv_endpoint"},
    {.yaml_key = "job.name", .type = ValueType::kFileOnly},
    {.name = "rdzv_backend", .yaml_key = "rendezvous.backend", .type = ValueType::kBackend,
     .default_value = "c10d", .default_text = "c10d", .metavar = "c10d|static", .group = kGroupRdzv,
     .help = "c10d: dynamic rendezvous, hosted by ddprun (single node) or by ddprund at "
             "--rdzv_endpoint ('ddprun' is an alias); static: fixed membership, see below. "
             "Without it, --master_addr/--master_port select static, as in torchrun"},
    {.name = "rdzv_endpoint", .yaml_key = "rendezvous.endpoint", .type = ValueType::kEndpoint,
     .default_text = "none", .metavar = "HOST[:PORT]", .group = kGroupRdzv,
     .help = "ddprund (or an agent hosting the rendezvous) to join; default port 29400"},
    {.rdzv_conf = "token", .yaml_key = "rendezvous.token", .type = ValueType::kToken,
     .default_text = "none", .metavar = "SECRET", .help = "nodes must present the same token"},
    {.rdzv_conf = "join_timeout", .yaml_key = "rendezvous.join_timeout",
     .type = ValueType::kPositiveSeconds, .default_value = rendezvous::kDefaultJoinTimeout,
     .default_text = rendezvous::kDefaultJoinTimeout,
     .metavar = "SECONDS",
     .dest = kInPolicy<&rendezvous::JobPolicy::join_timeout_s>},
    {.rdzv_conf = "last_call_timeout", .yaml_key = "rendezvous.last_call_timeout",
     .type = ValueType::kSeconds, .default_value = rendezvous::kDefaultLastCallTimeout,
     .default_text = rendezvous::kDefaultLastCallTimeout,
     .metavar = "SECONDS",
     .dest = kInPolicy<&rendezvous::JobPolicy::last_call_timeout_s>},
    {.name = "dashboard_port", .type = ValueType::kPortOrOff, .default_value = "0",
     .default_text = "0", .metavar = "PORT|off", .group = kGroupRdzv,
     .help = "Monitoring port of the rendezvous ddprun hosts: live dashboard, /api/v1/jobs, "
             "Prometheus /metrics (docs/monitoring.md); 0: the OS picks one and ddprun prints "
             "the URL; off: none",
     .dest = kInOptions<&agent::AgentOptions::dashboard_port>},
    {.name = "rdzv_conf", .type = ValueType::kRdzvConf, .default_text = "none", .metavar = "K=V,...",
     .group = kGroupRdzv, .help = "Keys:"},  // the keys' entries above complete the help
    // TLS on the control plane (docs/tls.md): this node's files, the same
    // meaning for the agent, its workers (DDPRUN_TLS_*) and `ddprun status`.
    {.name = "tls_ca", .yaml_key = "rendezvous.tls_ca", .type = ValueType::kText,
     .default_text = "none: plaintext", .metavar = "FILE", .group = kGroupRdzv,
     .help = "PEM CA that signed ddprund's certificate: talk TLS to the rendezvous and "
             "verify it (workers' store calls too); the hosting node's rendezvous requires "
             "client certificates signed by it"},
    {.name = "tls_cert", .yaml_key = "rendezvous.tls_cert", .type = ValueType::kText,
     .default_text = "none", .metavar = "FILE", .group = kGroupRdzv,
     .help = "PEM certificate of this node, presented for mutual TLS (ddprund "
             "--tls_client_ca); served by this node when it hosts the rendezvous"},
    {.name = "tls_key", .yaml_key = "rendezvous.tls_key", .type = ValueType::kText,
     .default_text = "none", .metavar = "FILE", .group = kGroupRdzv,
     .help = "PEM private key of --tls_cert"},
    // The monitoring port's TLS and basic auth (docs/security.md).
    {.name = "web_config", .yaml_key = "rendezvous.web_config", .type = ValueType::kText,
     .default_text = "none: plain HTTP", .metavar = "FILE", .group = kGroupRdzv,
     .help = "TLS and basic auth of the monitoring port (--dashboard_port), in the Prometheus exporter "
             "toolkit's web configuration format (docs/security.md)"},
    // Job shape.
    {.name = "nnodes", .yaml_key = "nodes.count", .type = ValueType::kNodeRange,
     .default_value = "1", .default_text = "1", .metavar = "N|MIN:MAX", .group = kGroupJob,
     .help = "Number of nodes, or a range for an elastic job (0 < MIN <= MAX)"},
    {.yaml_key = "nodes.hosts", .type = ValueType::kFileOnly},
    {.name = "scheduler", .yaml_key = "scheduler", .type = ValueType::kScheduler,
     .default_value = "auto", .default_text = "auto", .metavar = "auto|slurm|mpi|none",
     .group = kGroupJob,
     .help = "Where node rank, node count and the rendezvous host come from when not given: "
             "auto (Slurm in a multi-node srun step, or OpenMPI/PMIx), slurm, mpi, or none "
             "(never read them)"},
    {.name = "nproc_per_node", .yaml_key = "nproc_per_node", .type = ValueType::kNproc,
     .default_value = "1", .default_text = "1", .metavar = "N|cpu|gpu|xpu|auto",
     .group = kGroupJob,
     .help = "Workers on this node: a number, cpu (hardware threads), gpu (NVIDIA or AMD GPUs), "
             "xpu (Intel GPUs) or auto (gpu if any, else cpu)"},
    {.name = "role", .yaml_key = "role", .type = ValueType::kText, .default_value = agent::kDefaultRole,
     .default_text = agent::kDefaultRole, .metavar = "NAME", .group = kGroupJob,
     .help = "Worker role, given to workers as ROLE_NAME",
     .dest = kInOptions<&agent::AgentOptions::role>},
    {.yaml_key = "command", .type = ValueType::kFileOnly},
    {.yaml_key = "args", .type = ValueType::kFileOnly},
    {.name = "module", .short_flag = "m", .yaml_key = "module", .type = ValueType::kBool,
     .default_text = "off", .group = kGroupCommand,
     .help = "Run SCRIPT as a Python module: $PYTHON_EXEC -u -m SCRIPT"},
    {.name = "no_python", .yaml_key = "no_python", .type = ValueType::kBool, .default_text = "off",
     .group = kGroupCommand,
     .help = "Exec SCRIPT directly instead of through $PYTHON_EXEC (it must be executable)"},
    {.name = "max_restarts", .yaml_key = "restart.max_restarts", .type = ValueType::kCount,
     .default_value = rendezvous::kDefaultMaxRestarts,
     .default_text = rendezvous::kDefaultMaxRestarts, .metavar = "N", .group = kGroupJob,
     .help = "Restarts of the whole job after worker failures before giving up", .min = 0,
     .max = 1'000'000, .what = "a non-negative integer",
     .dest = kInPolicy<&rendezvous::JobPolicy::max_restarts>},
    {.name = "restart_policy", .yaml_key = "restart.policy", .type = ValueType::kRestartPolicy,
     .default_value = rendezvous::kDefaultRestartPolicy,
     .default_text = rendezvous::kDefaultRestartPolicy, .metavar = "job|inplace",
     .group = kGroupJob,
     .help = "What a worker failure restarts: every worker of the job (job), or only the failed "
             "workers while the others re-form in their own processes (inplace; needs "
             "--max_restarts >= 1; docs/recovery.md)",
     .dest = kInPolicy<&rendezvous::JobPolicy::restart_policy>},
    {.name = "warm_modules", .yaml_key = "restart.warm_modules", .type = ValueType::kText,
     .default_value = agent::kDefaultWarmModules, .default_text = agent::kDefaultWarmModules,
     .metavar = "MODULE,...|none", .group = kGroupJob,
     .help = "With --restart_policy=inplace and a Python script or module: each node keeps one "
             "interpreter that has imported these modules, and the next replacement worker runs "
             "in it instead of a fresh interpreter (a warm start; docs/recovery.md); none: "
             "replacements start cold",
     .dest = kInOptions<&agent::AgentOptions::warm_modules>},
    {.name = "grace_period", .yaml_key = "restart.grace_period", .type = ValueType::kSeconds,
     .default_value = agent::kDefaultGracePeriod,
     .default_text = agent::kDefaultGracePeriod, .metavar = "SECONDS", .group = kGroupJob,
     .help = "Time between SIGTERM and SIGKILL when stopping workers (also read from "
             "TORCH_ELASTIC_SHUTDOWN_TIMEOUT)"},
    {.name = "shutdown_timeout", .type = ValueType::kSeconds, .default_text = "--grace_period",
     .metavar = "SECONDS", .group = kGroupJob,
     .help = "torchrun 2.12's name for --grace_period (the two must agree when both are given)"},
    {.name = "virtual_local_rank", .type = ValueType::kBool, .default_text = "off",
     .group = kGroupJob,
     .help = "Every worker sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES set to its own GPU: entry "
             "<local rank> of this node's CUDA_VISIBLE_DEVICES, or <local rank> when unset "
             "(torchrun 2.10+)",
     .dest = kInOptions<&agent::AgentOptions::virtual_local_rank>},
    {.name = "signals_to_handle", .yaml_key = "restart.signals_to_handle",
     .type = ValueType::kSignals, .default_value = agent::kDefaultSignalsToHandle,
     .default_text = agent::kDefaultSignalsToHandle, .metavar = "SIG,...", .group = kGroupJob,
     .help = "Signals that stop the job, as in torchrun: forwarded to every worker, SIGKILL "
             "after the grace period. SIGTERM, SIGINT, SIGHUP and SIGQUIT always; add "
             "SIGUSR1/SIGUSR2 to stop on them too (exported as TORCHELASTIC_SIGNALS_TO_HANDLE)"},
    {.name = "forward_signals", .yaml_key = "restart.forward_signals", .type = ValueType::kSignals,
     .default_value = "", .default_text = "none", .metavar = "SIGUSR1,SIGUSR2",
     .group = kGroupJob,
     .help = "Forward these to every worker while the job keeps running (e.g. Slurm's "
             "pre-emption warning, --signal=USR1@60); SIGUSR1 and SIGUSR2 only"},
    {.name = "cpu_bind", .yaml_key = "cpu_bind", .type = ValueType::kCpuBind,
     .default_value = "none", .default_text = "none", .metavar = "auto|none|core|numa",
     .group = kGroupJob,
     .help = "CPUs of each worker: core splits the cores ddprun may use into nproc_per_node "
             "blocks, one per local rank (mpirun's --bind-to core; more workers than cores is an "
             "error); numa binds local rank i to NUMA node i*nodes/nproc; none binds nothing; "
             "auto: core when 2 <= nproc_per_node <= cores, else none"},
    {.name = "numa_binding", .type = ValueType::kText, .default_text = "none",
     .metavar = "node|socket|exclusive|core-complex", .group = kGroupJob,
     .help = "Bind each worker to the CPUs of its GPU's NUMA node (torchrun 2.9+); exclusive "
             "splits the node's cores among the workers on it; without an NVIDIA GPU, one line "
             "and no binding"},
    // Output.
    {.name = "log_dir", .yaml_key = "logs.log_dir", .type = ValueType::kText,
     .default_text = "a fresh $TMPDIR/ddprun_XXXXXX", .metavar = "DIR", .group = kGroupOutput,
     .help = "Base of <run_id>/attempt_<round>/<local_rank>/{stdout,stderr}.log and error.json; "
             "/dev/null: no log files at all (as torchrun)"},
    {.name = "redirects", .short_flag = "r", .yaml_key = "logs.redirects",
     .type = ValueType::kStreams, .default_value = "0", .default_text = "0",
     .metavar = "0-3|RANK:V,...", .group = kGroupOutput,
     .help = "Send worker stdout (1), stderr (2) or both (3) to files in the log dir instead "
             "of the console",
     .dest = kInLauncher<&LauncherOptions::redirects>},
    {.name = "tee", .short_flag = "t", .yaml_key = "logs.tee", .type = ValueType::kStreams,
     .default_value = "0", .default_text = "0", .metavar = "0-3|RANK:V,...", .group = kGroupOutput,
     .help = "Like --redirects, and also to the console, each line prefixed as "
             "--log_line_prefix_template says",
     .dest = kInLauncher<&LauncherOptions::tee>},
    {.name = "local_ranks_filter", .yaml_key = "logs.local_ranks_filter",
     .type = ValueType::kRankList, .default_value = "", .default_text = "all",
     .metavar = "RANK,...", .group = kGroupOutput,
     .help = "Show only these local ranks' output on the console (files keep everything)",
     .dest = kInLauncher<&LauncherOptions::local_ranks_filter>},
    {.name = "prefix_output", .yaml_key = "logs.prefix_output", .type = ValueType::kBool,
     .default_text = "off", .group = kGroupOutput,
     .help = "Prefix every console line of the workers, as -t does",
     .dest = kInLogs<&agent::LogSpec::prefix_output>},
    {.name = "duplicate_stdout_filters", .type = ValueType::kText, .default_text = "none",
     .metavar = "TEXT,...", .group = kGroupOutput,
     .help = "Tee'd stdout lines containing any of these (',,' is a comma) also go to "
             "<attempt dir>/filtered_stdout.log (torchrun 2.9+)"},
    {.name = "duplicate_stderr_filters", .type = ValueType::kText, .default_text = "none",
     .metavar = "TEXT,...", .group = kGroupOutput,
     .help = "The same for stderr: <attempt dir>/filtered_stderr.log"},
    {.name = "log_line_prefix_template", .type = ValueType::kText,
     .default_text = "[${role_name}${local_rank}]:", .metavar = "TEMPLATE", .group = kGroupOutput,
     .help = "Console prefix of -t and --prefix_output, with ${role_name}, ${rank}, "
             "${local_rank} and ${hostname} (torchrun's macros; also "
             "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE); [${hostname}:${rank}:${local_rank}]: "
             "tells nodes apart"},
    // The one owner of this default; the agent gets it through AgentOptions::logs.
    {.name = "stderr_tail_lines", .yaml_key = "logs.stderr_tail_lines", .type = ValueType::kCount,
     .default_value = "20", .default_text = "20", .metavar = "N", .group = kGroupOutput,
     .help = "Lines of each worker's stderr kept for the failure report; 0 leaves stderr "
             "unpiped",
     .min = 0, .max = 10'000, .what = "a number of lines in 0..10000",
     .dest = kInLogs<&agent::LogSpec::stderr_tail_lines>},
    // Monitoring (docs/monitoring.md, docs/monitoring-sources.md).
    {.name = "hang_timeout", .yaml_key = "monitoring.hang_timeout", .type = ValueType::kSeconds,
     .default_value = rendezvous::kDefaultHangTimeout,
     .default_text = rendezvous::kDefaultHangTimeout, .metavar = "SECONDS",
     .group = kGroupMonitoring,
     .help = "Report a hang when no rank made progress (optimizer steps, ddp::metrics::Step, "
             "SDK collectives) for this long while every worker runs; 0 disables it",
     .dest = kInPolicy<&rendezvous::JobPolicy::hang_timeout_s>},
    {.name = "on_hang", .yaml_key = "monitoring.on_hang", .type = ValueType::kOnHang,
     .default_value = rendezvous::kDefaultOnHang,
     .default_text = rendezvous::kDefaultOnHang, .metavar = "report|restart|abort",
     .group = kGroupMonitoring,
     .help = "After a hang report (culprit ranks and their stacks): report only, restart the "
             "job (counts against --max_restarts) or abort it",
     .dest = kInPolicy<&rendezvous::JobPolicy::on_hang>},
    {.name = "no_python_hook", .yaml_key = "monitoring.no_python_hook", .type = ValueType::kBool,
     .default_text = "off", .group = kGroupMonitoring,
     .help = "Do not put ddprun's start-up hook (optimizer steps, samples, stacks) on the Python "
             "workers' PYTHONPATH; DDPRUN_PYTHON_HOOK=0 turns it off for one job too"},
    {.yaml_key = "environment.set", .type = ValueType::kFileOnly},
    {.yaml_key = "environment.pass", .type = ValueType::kFileOnly},
    {.yaml_key = "nccl.NCCL_*", .type = ValueType::kFileOnly},
    // Command line only.
    // Checkpoints in memory (docs/checkpoint.md); per node but --ckpt_replicas
    // (a JobPolicy field).
    {.name = "ckpt_shm_limit", .type = ValueType::kBytes, .default_value = "16GiB",
     .default_text = "16GiB", .metavar = "BYTES", .group = kGroupJob,
     .help = "Largest checkpoint one worker may save with ddprun.checkpoint.save (memory the "
             "agent owns, two slots per worker, three with --ckpt_replicas 1, used as "
             "written); 0: no checkpoint memory",
     .dest = kInOptions<&agent::AgentOptions::ckpt_shm_limit>},
    {.name = "ckpt_dir", .yaml_key = "checkpoint.dir", .type = ValueType::kText,
     .default_text = "none", .metavar = "DIR", .group = kGroupJob,
     .help = "Directory the agent writes each rank's newest committed checkpoint to, in the "
             "background, on SIGTERM and at the job's end (safetensors files and a manifest); "
             "a job started on it resumes from the newest step every rank has there",
     .dest = kInOptions<&agent::AgentOptions::ckpt_dir>},
    {.name = "ckpt_every", .yaml_key = "checkpoint.every", .type = ValueType::kCount,
     .default_value = "1", .default_text = "1", .metavar = "N", .group = kGroupJob,
     .help = "ddprun.checkpoint.save keeps only steps that are multiples of N (others return "
             "False at once)",
     .min = 1, .max = 1'000'000'000, .what = "a positive integer",
     .dest = kInOptions<&agent::AgentOptions::ckpt_every>},
    {.name = "ckpt_replicas", .yaml_key = "checkpoint.replicas", .type = ValueType::kCount,
     .default_value = rendezvous::kDefaultCkptReplicas,
     .default_text = rendezvous::kDefaultCkptReplicas, .metavar = "0|1", .group = kGroupJob,
     .help = "1: each node's newest committed checkpoint is copied to the next node's agent in "
             "the background, and a node that takes a lost node's seat restores it from there "
             "(job-wide: the first node's value holds, another node's is told so)",
     .min = 0, .max = 1, .what = "0 or 1",
     .dest = kInPolicy<&rendezvous::JobPolicy::ckpt_replicas>},
    {.name = "ckpt_encrypt", .yaml_key = "checkpoint.encrypt", .type = ValueType::kCount,
     .default_value = rendezvous::kDefaultCkptEncrypt,
     .default_text = rendezvous::kDefaultCkptEncrypt, .metavar = "0|1", .group = kGroupJob,
     .help = "With --ckpt_replicas 1: 1 encrypts the replicas between agents (AES-256-GCM, "
             "keys from an X25519 exchange per connection and the job's secret; "
             "libcrypto.so.3 is loaded then), 0 sends them in "
             "plaintext, authenticated (job-wide: the first node's value holds)",
     .min = 0, .max = 1, .what = "0 or 1",
     .dest = kInPolicy<&rendezvous::JobPolicy::ckpt_encrypt>},
    {.name = "ckpt_bandwidth", .yaml_key = "checkpoint.bandwidth", .type = ValueType::kBytes,
     .default_value = "0", .default_text = "0", .metavar = "BYTES",
     .group = kGroupJob,
     .help = "Bytes per second the agent's background checkpoint work may move (--ckpt_dir "
             "writes, --ckpt_replicas sends), as 256MiB; 0: no limit. A flush on SIGTERM or at "
             "the job's end is never limited",
     .dest = kInOptions<&agent::AgentOptions::ckpt_bandwidth>},
    {.name = "standalone", .type = ValueType::kBool, .default_text = "off", .group = kGroupRdzv,
     .help = "Single-node job with its own private rendezvous; ignores --rdzv_backend, "
             "--rdzv_endpoint and --rdzv_id"},
    {.name = "node_rank", .type = ValueType::kCount,
     .default_text = "0 for static, otherwise none", .metavar = "N", .group = kGroupRdzv,
     .help = "This node's rank; required by static with several nodes, a requested group rank "
             "with c10d",
     .min = 0, .max = 1'000'000, .what = "a non-negative integer"},
    {.name = "local_addr", .type = ValueType::kText,
     .default_text = "127.0.0.1 on a single node, else the hostname", .metavar = "ADDR",
     .group = kGroupRdzv,
     .help = "Address this node advertises to the others (MASTER_ADDR when it is group rank 0)"},
    {.name = "master_addr", .type = ValueType::kText, .default_value = "127.0.0.1",
     .default_text = "127.0.0.1", .metavar = "ADDR", .group = kGroupStatic,
     .help = "Address of node rank 0, which hosts the store"},
    {.name = "master_port", .type = ValueType::kPort, .default_value = rendezvous::kDefaultMasterPortText,
     .default_text = rendezvous::kDefaultMasterPortText, .metavar = "PORT", .group = kGroupStatic,
     .help = "Port of node rank 0's store"},
    {.name = "run_path", .type = ValueType::kBool, .default_text = "off", .group = kGroupCommand,
     .help = "Not supported: ddprun always runs workers as processes"},
    {.name = "monitor_interval", .type = ValueType::kSeconds, .default_value = "0.1",
     .default_text = "0.1", .metavar = "SECONDS", .group = kGroupCompat,
     .help = "Ignored: ddprun reacts to worker exits as they happen instead of polling",
     .dest = kInLauncher<&LauncherOptions::monitor_interval>},
    {.name = "start_method", .type = ValueType::kStartMethod, .default_value = "spawn",
     .default_text = "spawn", .metavar = "spawn|fork|forkserver", .group = kGroupCompat,
     .help = "Ignored: workers are always separate processes",
     .dest = kInLauncher<&LauncherOptions::start_method>},
    {.name = "event_log_handler", .type = ValueType::kText, .default_value = "null",
     .default_text = "null", .metavar = "NAME", .group = kGroupCompat,
     .help = "Ignored: torchrun's destination for its internal events; ddprun reports its "
             "events on the console, the dashboard and /metrics"},
    {.name = "logs_specs", .type = ValueType::kText, .default_text = "none", .metavar = "NAME",
     .group = kGroupCompat,
     .help = "torchrun's log layout plugin (a Python entry point): only the default is "
             "supported, so it must be left unset"},
    {.name = "config", .type = ValueType::kText, .default_text = "none", .metavar = "FILE",
     .group = kGroupConfig,
     .help = "A YAML job file (docs/config.md), the same on every node; flags and PET_* "
             "override its values"},
    {.name = "print_config", .type = ValueType::kBool, .default_text = "off",
     .group = kGroupConfig,
     .help = "Print the merged job and where each value came from (flag, env, file, default), "
             "then exit without starting anything"},
};
// clang-format on

// The entry with this flag name, or this --rdzv_conf key, or this YAML key;
// nullptr if none.
const Knob* FindKnob(absl::string_view name);
const Knob* FindRdzvConfKnob(absl::string_view key);
const Knob* FindYamlKnob(absl::string_view yaml_key);
// Like FindKnob, for a name the table must have (a programming error otherwise).
const Knob& KnobNamed(absl::string_view name);

std::string PetName(absl::string_view flag_name);   // "PET_NPROC_PER_NODE"
std::string DashName(absl::string_view flag_name);  // "nproc-per-node"

}  // namespace ddprun::launcher
