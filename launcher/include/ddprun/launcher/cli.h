// ddprun's command line: torchrun's flags (both the underscore and the dash
// spelling), PET_<NAME> environment defaults and the worker command, turned
// into the AgentOptions of one node.
//
// Contract:
//  - Precedence is CLI > environment (PET_<NAME>, a few others) > default.
//  - Everything after the training script is passed through verbatim.
//  - Every bad input yields an InvalidArgument status whose message is ONE
//    line, starting with "ddprun: ", that names the problem and the fix; the
//    caller prints it and exits with ddprun::kExitUsage (2).
//  - The knobs, their defaults and parsers are the table in knobs.h; a bad
//    value gets the same problem-and-fix text as in a job file.
//  - Pure apart from reading the file system (the script, PATH lookups) and
//    drawing a random job id; the environment and the machine's CPU/GPU
//    counts are injected so that tests control them.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/worker_env.h"

namespace ddprun::launcher {

using agent::Env;

inline constexpr const char* kDefaultPythonExec = "python3";  // on PATH, the last resort

// The interpreter of Python workers, as a torchrun in the same environment
// would run them (torchrun uses its own interpreter, sys.executable): the
// first of PYTHON_EXEC; $VIRTUAL_ENV/bin/python (a venv, activated or merely
// named); $CONDA_PREFIX/bin/python; python3 beside the ddprun executable when
// that directory is a venv's bin/ (`pip install` of ddprun into a venv); else
// python3 on PATH. `why` says which rule chose it, for --print-config.
struct PythonChoice {
  std::string path;
  std::string why;
};
// `self_exe`: the running ddprun's path ("" to skip that rule).
PythonChoice ChoosePython(const Env& env, const std::string& self_exe);
// The running executable (/proc/self/exe), "" when unknown.
std::string SelfExe();

// Which standard streams of a worker go to files, torchrun's -r/-t value
// (agent/log_spec.h).
using StdStreams = agent::StdStreams;

// Flags as the launcher parsed them. The output flags are also copied into
// AgentOptions::logs, which the agent applies.
struct LauncherOptions {
  StdStreams redirects;                 // -r/--redirects
  StdStreams tee;                       // -t/--tee
  std::vector<int> local_ranks_filter;  // --local_ranks_filter; empty: every rank
  // Accepted for compatibility and validated: the agent is event-driven and
  // workers are processes. Defaults: knobs.h.
  std::chrono::duration<double> monitor_interval{};
  std::string start_method;
};

enum class Action {
  kRun,          // run a node with `options`
  kHelp,         // print `text` (the help, or --print-completion's script) to stdout, exit 0
  kVersion,      // print `text` (the version) to stdout, exit 0
  kPrintConfig,  // --print-config: print `text` (the merged job) to stdout, exit 0
};

struct ParsedCommand {
  Action action = Action::kRun;
  std::string text;
  agent::AgentOptions options;
  LauncherOptions launcher;
  // Non-fatal notes (ignored flags, fallbacks), one line each, "ddprun: "
  // prefixed; main prints them to stderr before running.
  std::vector<std::string> warnings;
};

// Facts about this machine that --nproc_per_node=cpu|gpu|auto, a job file's
// placement and --cpu_bind depend on. All but the CPU count are probes, run
// only when the command line needs the fact: the names are a netlink dump,
// the GPUs a /dev scan, the topology two sysfs files per core, ~1 ms of a
// launch's start in all (docs/launch.md, "Sixth pass"), and a plain
// `--nproc_per_node=8` job needs none of them. Tests set lambdas.
struct HostFacts {
  int cpu_count = 1;
  std::function<int()> gpu_count;        // NVIDIA GPUs (CountNvidiaGpus)
  std::function<int()> amd_gpu_count;    // AMD GPUs (CountAmdGpus)
  std::function<int()> intel_gpu_count;  // Intel GPUs (CountIntelGpus), for =xpu only
  // This machine's host names and interface addresses, matched against a job
  // file's nodes.hosts (placement.h).
  std::function<std::vector<std::string>()> names;
  // The cores ddprun may use (its affinity mask), for --cpu_bind.
  std::function<agent::CpuTopology()> cpu_topology;
};
// A probe's answer; an unset probe reads as none (0 GPUs, no names, no cores).
int GpuCount(const HostFacts& host);
int AmdGpuCount(const HostFacts& host);
int IntelGpuCount(const HostFacts& host);
std::vector<std::string> HostNames(const HostFacts& host);
agent::CpuTopology CpuTopologyOf(const HostFacts& host);

// The real machine: hardware threads now; CountNvidiaGpus(), ProbeHostNames()
// and ReadCpuTopology() as probes.
HostFacts ProbeHost();

// Counts NVIDIA GPUs without loading CUDA: the entries of proc_gpus_dir
// (/proc/driver/nvidia/gpus/<bus id>), or if that is absent or empty the
// /dev/nvidia<N> device nodes in dev_dir. Honours nothing else
// (CUDA_VISIBLE_DEVICES is not applied).
int CountNvidiaGpus(const std::string& dev_dir = "/dev",
                    const std::string& proc_gpus_dir = "/proc/driver/nvidia/gpus");
// Counts AMD GPUs as ROCm sees them: the nodes of the KFD topology whose
// properties have a non-zero simd_count (CPU nodes have none).
int CountAmdGpus(const std::string& kfd_nodes_dir = "/sys/class/kfd/kfd/topology/nodes");

// Counts Intel GPUs as torch.xpu sees them, without loading Level Zero: the
// DRM cards of drm_dir (card<N>, not connectors such as card0-DP-1) whose
// device/vendor is 0x8086 and that have a render node (device/drm/renderD*;
// a display-only card has none). Each card counts once (its tiles are not
// counted separately). Honours nothing else (ZE_AFFINITY_MASK is not applied).
int CountIntelGpus(const std::string& drm_dir = "/sys/class/drm");

// How many of `physical` Intel GPUs ZE_AFFINITY_MASK leaves, as Level Zero
// reads it: entries "N" or "N.T" (tile T of card N) whose N is below
// `physical` count one each, others are ignored; an empty mask hides nothing.
int ZeAffinityDevices(int physical, const std::string& mask);

// How many of `physical` devices a visibility list (CUDA_VISIBLE_DEVICES,
// ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) leaves, as the runtimes read it:
// entries up to the first invalid one (empty, negative, or an index not below
// `physical`); UUID-style entries (GPU-..., MIG-...) count as one each; never
// more than `physical`.
int VisibleDevices(int physical, const std::string& list);

// For a subcommand whose arguments ParseCommandLine refused (`ddprun check`,
// `ddprun bench`): the first option in `args` that is neither a launcher flag
// nor one of `own` (the subcommand's flags, "--json"), as one line that names
// the closest of both and the subcommand's help ("ddprun check: unknown
// option '--chek_timeout' (did you mean --check_timeout?); see ddprun check
// --help"); nullopt when every option is known (the parser's message stands).
std::optional<std::string> UnknownSubcommandOption(const std::string& command,
                                                   const std::vector<std::string>& args,
                                                   const std::vector<std::string>& own);

// Parses ddprun's arguments (args[0] is the program name).
absl::StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& args, const Env& env,
                                               const HostFacts& host);
absl::StatusOr<ParsedCommand> ParseCommandLine(int argc, char** argv, const Env& env,
                                               const HostFacts& host);

// What runs in each worker, before ${local_rank} substitution.
struct ScriptSpec {
  std::string script;             // path, PATH name, or module with `module`
  std::vector<std::string> args;  // verbatim
  bool module = false;            // -m: `$PYTHON_EXEC -u -m script args`
  bool no_python = false;         // --no_python: exec script directly
};

// Builds the worker argv:
//  - module:    $PYTHON_EXEC -u -m MODULE ARGS
//  - no_python: SCRIPT ARGS (must be an executable file, or on PATH)
//  - otherwise: SCRIPT ARGS if SCRIPT is an executable file not ending in .py
//               (a path with '/', a file in the working directory, or a name
//               found on PATH), else $PYTHON_EXEC -u SCRIPT ARGS.
// $PYTHON_EXEC is ChoosePython's choice. Warnings go to `warnings` when non-null.
absl::StatusOr<std::vector<std::string>> BuildWorkerCommand(const ScriptSpec& spec, const Env& env,
                                                            std::vector<std::string>* warnings);

// "ddprun 0.1.0" (the one version value: git describe, else the project
// version; top CMakeLists.txt). Nodes compare it in `ddprun check`.
std::string VersionString();

// What this build has, one fact a line: compiler, gRPC version, the NCCL
// backend (built or not, with the CUDA version). `ddprun --version` prints it
// after VersionString().
std::string BuildInfoString();

// Where this machine's NCCL is, for `ddprun --version` in a build with the
// NCCL backend (which loads NCCL at run time: worker_sdk/src/nccl_loader.h):
// "NCCL: libnccl.so.2 2.28.9 at /path", or "NCCL: libnccl.so.2 not found
// here: <why>; <how to get it>" (the same library the SDK would load:
// DDP_NCCL_LIBRARY, else the soname). "" in a build without the backend.
// Loads the library (dlopen, never closed) to ask its version.
std::string NcclRuntimeString();

}  // namespace ddprun::launcher
