// A job described once in a YAML file (`ddprun --config job.yaml`), run on
// every node. The file is parsed and validated here, before anything starts;
// the launcher then layers it under the command line (cli.cc):
//
//     flag  >  PET_<FLAG> (or the variable itself, for NCCL_* and environment)  >  file  >  default
//
// kKnobs (knobs.h) is the one table that ties each flag to its YAML key,
// default and parser; the keys this file accepts and every value check come
// from it (value_parsers.h), so a bad value reads the same as its flag's.
//
// Contract:
//  - Every problem yields an InvalidArgument status whose message is ONE
//    line, "FILE:LINE:COL: key.path: problem; fix" (lines and columns count
//    from 1), or "FILE: problem; fix" when no position applies (a missing,
//    unreadable or huge file).
//  - Values are checked by their flag's parser and stored as the flag would
//    be written ("2:4", "600"), with the position they came from.
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
// The mode of a value ParseScheduler returned ("auto", "slurm", "mpi", "none").
SchedulerMode SchedulerModeNamed(absl::string_view name);

struct JobConfig {
  std::string path;
  std::string name;  // job.name: shown, not used
  // By YAML key (Knob::yaml_key): the file's value of each knob it sets.
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

  // The knob values this file sets, keyed by Knob::Dest() ("nnodes", or
  // "rdzv_conf.<key>" for --rdzv_conf keys); nnodes and nproc_per_node are
  // derived from nodes.hosts when not written.
  std::map<std::string, KnobValue> FlagValues() const;
};

// Reads and validates the file: missing, unreadable, a directory, over
// kMaxConfigBytes, or invalid content is an error.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Validates `text` as if read from `path` (used in messages only).
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& path);

}  // namespace ddprun::launcher
