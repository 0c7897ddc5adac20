// Where this node sits in a job described by a file: its node rank, the node
// count and the rendezvous host, from the command line, the file's node list
// (matched against this machine's names and addresses) or the scheduler
// (Slurm, OpenMPI/PMIx). Pure: the environment and this machine's names are
// passed in, so tests simulate any cluster.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/launcher/job_config.h"

namespace ddprun::launcher {

// Expands a Slurm host list: "node[01-04,07]", "a[1-2]-ib,b3",
// "rack[1-2]-n[1-2]" (several brackets: every combination, in order).
// Zero padding follows the range's first bound. Errors on unbalanced
// brackets, reversed or malformed ranges, and lists over 100000 hosts.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(const std::string& list);

// What the scheduler says about this process's place.
struct SchedulerInfo {
  std::string name;            // "slurm" or "mpi"
  int node_rank = -1;          // -1: not given
  int nnodes = -1;             // -1: not given
  std::vector<std::string> hosts;  // Slurm's node list, expanded; empty for MPI
  std::string rank_var, nnodes_var, hosts_var;  // the variables they came from
  std::vector<std::string> warnings;            // "ddprun: ..." lines
};

// Detects Slurm (SLURM_JOB_ID with SLURM_NODEID or a node list) or
// OpenMPI/PMIx (OMPI_COMM_WORLD_RANK, PMIX_RANK) per `mode`; nullopt when none
// applies. Refuses inconsistent variables (a node list whose length is not
// SLURM_NNODES, several ddprun per node) with a one-line message.
absl::StatusOr<std::optional<SchedulerInfo>> DetectScheduler(
    const std::map<std::string, std::string>& env, SchedulerMode mode);

// This machine's names: gethostname() (and its short form) and the address of
// every interface (getifaddrs), loopback included.
std::vector<std::string> ProbeHostNames();

// The merged values placement starts from (KnobValue::is_set(): given by a
// flag, PET_* or the file).
struct PlacementInput {
  KnobValue nnodes, node_rank, rdzv_endpoint, local_addr, rdzv_backend;
};

// Values placement decided, by flag name ("node_rank", "nnodes",
// "rdzv_endpoint", "local_addr"), to be layered where nothing was given.
struct Placement {
  std::map<std::string, KnobValue> values;
  std::vector<std::string> warnings;  // "ddprun: ..." lines
  std::string summary;                // how the node rank was found, for --print-config
};

// Decides node rank, node count and rendezvous endpoint:
//  - node rank: --node_rank/PET_NODE_RANK, else this host in nodes.hosts
//    (--local_addr if given, else host_names), else the scheduler;
//  - node count: given, else the scheduler's; a scheduler count outside the
//    given range is an error, never a hang;
//  - endpoint "first_node[:PORT]", or none with several nodes and a known
//    host list: the first host (file's list, else the scheduler's), port
//    29400 (static: master port 29500).
absl::StatusOr<Placement> ResolvePlacement(const JobConfig& job, const PlacementInput& in,
                                           const std::map<std::string, std::string>& env,
                                           const std::vector<std::string>& host_names);

// Whether a command line without a job file takes its placement from the
// scheduler: --scheduler=slurm|mpi, or auto inside a multi-node srun step
// (SLURM_JOB_ID with SLURM_STEP_NUM_NODES other than 1) or an MPI world of
// several processes (OMPI_COMM_WORLD_SIZE or PMI_SIZE other than 1). A
// single-node step, the batch script and --scheduler=none: false.
bool SchedulerPlacesJob(const std::map<std::string, std::string>& env, SchedulerMode mode);

// Placement without a job file, and the one line that says where it came from.
struct SchedulerPlacement {
  Placement placement;
  std::string notice;  // "ddprun: placed by slurm: node 1 of 2 (...)"; empty: none applied
};

// ResolvePlacement for a command line without a job file (the same rules and
// errors), plus: a Slurm step names the job (rdzv_id "slurm-<job>-<step>")
// when no --rdzv_id is given, and no rendezvous endpoint is chosen when
// --master_addr is given (the static rendezvous' own address wins).
absl::StatusOr<SchedulerPlacement> PlaceFromScheduler(const PlacementInput& in,
                                                      bool master_addr_given, bool job_id_given,
                                                      const std::map<std::string, std::string>& env,
                                                      SchedulerMode mode);

}  // namespace ddprun::launcher
