// A job described once in a YAML file (`ddprun --config job.yaml`), run on
// every node. The file is parsed and validated here, before anything starts;
// the launcher then layers it under the command line (cli.cc):
//
//     flag  >  PET_<FLAG> (or the variable itself, for NCCL_* and environment)  >  file  >  default
//
// kKnobs is the one table that ties each flag to its YAML key and default;
// docs/config.md documents the same table.
//
// Contract:
//  - Every problem yields an InvalidArgument status whose message is ONE
//    line, "FILE:LINE:COL: key.path: problem; fix" (lines and columns count
//    from 1), or "FILE: problem; fix" when no position applies (a missing,
//    unreadable or huge file).
//  - Values are stored as the flag would be written ("2:4", "600"), with the
//    position they came from, so the command line's checks apply to them too.
//  - Pure: reads the file and nothing else (no environment, no network).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::launcher {

inline constexpr std::size_t kMaxConfigBytes = 1 << 20;  // 1 MiB: a job file is a page, not data

// Where a resolved value came from, for messages and --print-config.
enum class Origin {
  kDefault,    // built in
  kFlag,       // --name on the command line
  kEnv,        // PET_NAME, or the variable itself (NCCL_*, environment.set)
  kFile,       // the --config file
  kScheduler,  // Slurm or OpenMPI/PMIx variables
  kHost,       // this node's entry in the file's node list
};

const char* OriginName(Origin origin);  // "default", "flag", "env", "file", "scheduler", "host"

// One value and where it came from.
struct KnobValue {
  std::string value;
  // "--nnodes", "PET_NNODES", "job.yaml:4:10: nodes.count", "SLURM_NNODES", "" (default).
  std::string source;
  Origin origin = Origin::kDefault;
  bool is_set() const { return !source.empty(); }
  // How to name it in a message: "--nnodes", or "PET_NNODES (--nnodes)".
  std::string Name(const std::string& flag) const;
};

// The table of knobs: flag (its underscore name; PET_<FLAG> follows), the
// YAML key (nullptr: command line only, because the file is shared by every
// node) and the default as --help and docs/config.md show it. Entries with a
// `rdzv_conf` key are keys of --rdzv_conf rather than flags of their own.
struct Knob {
  const char* flag;
  const char* rdzv_conf;  // nullptr, or the --rdzv_conf key
  const char* yaml_key;
  const char* default_text;
};

inline constexpr Knob kKnobs[] = {
    {"rdzv_id", nullptr, "job.id", "none"},
    {"nnodes", nullptr, "nodes.count", "1 (or the number of nodes.hosts)"},
    {"node_rank", nullptr, nullptr, "from nodes.hosts or the scheduler, else any"},
    {"nproc_per_node", nullptr, "nproc_per_node", "1 (or the hosts' slots)"},
    {"role", nullptr, "role", "default"},
    {"max_restarts", nullptr, "restart.max_restarts", "0"},
    {"grace_period", nullptr, "restart.grace_period", "30"},
    {"signals_to_handle", nullptr, "restart.signals_to_handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
    {"rdzv_backend", nullptr, "rendezvous.backend", "c10d"},
    {"rdzv_endpoint", nullptr, "rendezvous.endpoint", "none (first_node when hosts are known)"},
    {"rdzv_conf", "join_timeout", "rendezvous.join_timeout", "600"},
    {"rdzv_conf", "last_call_timeout", "rendezvous.last_call_timeout", "30"},
    {"rdzv_conf", "token", "rendezvous.token", "none"},
    {"local_addr", nullptr, nullptr, "the matched nodes.hosts entry, else hostname"},
    {"module", nullptr, "module", "false"},
    {"no_python", nullptr, "no_python", "false"},
    {"log_dir", nullptr, "logs.log_dir", "none"},
    {"redirects", nullptr, "logs.redirects", "0"},
    {"tee", nullptr, "logs.tee", "0"},
    {"local_ranks_filter", nullptr, "logs.local_ranks_filter", "all"},
    {"prefix_output", nullptr, "logs.prefix_output", "false"},
    {"stderr_tail_lines", nullptr, "logs.stderr_tail_lines", "20"},
};

// The nccl: keys that have a name of their own; any NCCL_* key is also
// accepted verbatim.
struct NcclKey {
  const char* key;
  const char* env;
};
inline constexpr NcclKey kNcclKeys[] = {
    {"socket_ifname", "NCCL_SOCKET_IFNAME"}, {"ib_hca", "NCCL_IB_HCA"},
    {"debug", "NCCL_DEBUG"},                 {"debug_subsys", "NCCL_DEBUG_SUBSYS"},
    {"buffsize", "NCCL_BUFFSIZE"},           {"p2p_disable", "NCCL_P2P_DISABLE"},
    {"shm_disable", "NCCL_SHM_DISABLE"},
};

// A value as written in the file.
struct FileValue {
  std::string text;      // normalised: "2:4", "600", "1" for true
  std::string location;  // "job.yaml:4:10"
  std::string key;       // "nodes.count"
  std::string Source() const { return location + ": " + key; }  // KnobValue::source
};

// One entry of nodes.hosts: "name", "name slots=N" or {host: name, slots: N}.
struct HostEntry {
  std::string host;
  int slots = 0;  // 0: not given
  std::string location;
};

// Which scheduler's variables place this node (the file's `scheduler:` key).
enum class SchedulerMode { kAuto, kSlurm, kMpi, kNone };

struct JobConfig {
  std::string path;
  std::string name;  // job.name: shown, not used
  // By YAML key (the yaml_key of kKnobs): the file's value of each knob it sets.
  std::map<std::string, FileValue> values;
  std::vector<HostEntry> hosts;  // nodes.hosts, in order (node rank = index)
  std::string hosts_location;    // where nodes.hosts starts
  // command (+ args): the worker command, SCRIPT first; empty when not given.
  std::vector<std::string> command;
  std::string command_location;
  // environment.set (NAME -> value) and environment.pass (NAME), in file order.
  std::vector<std::pair<std::string, FileValue>> env_set;
  std::vector<FileValue> env_pass;
  // nccl: as variables (NCCL_SOCKET_IFNAME -> value), in file order.
  std::vector<std::pair<std::string, FileValue>> nccl;
  SchedulerMode scheduler = SchedulerMode::kAuto;
  std::string scheduler_location;

  // The knob values this file sets, keyed by flag name ("nnodes"), or
  // "rdzv_conf.<key>" for --rdzv_conf keys; nnodes and nproc_per_node are
  // derived from nodes.hosts when not written.
  std::map<std::string, KnobValue> FlagValues() const;
};

// Reads and validates the file: missing, unreadable, a directory, over
// kMaxConfigBytes, or invalid content is an error.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Validates `text` as if read from `path` (used in messages only).
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& path);

// Edit distance, for "did you mean".
std::size_t KeyDistance(const std::string& a, const std::string& b);

}  // namespace ddprun::launcher
