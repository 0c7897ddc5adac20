// Domain types of the rendezvous protocol. proto_convert.cc is the only place
// that maps them to and from ddprun.v1 protos.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "ddprun/rendezvous/common/job_policy.h"

namespace ddprun::rendezvous {

inline constexpr std::uint32_t kProtocolVersion = 1;

// What an agent sends when it joins a round.
struct JoinSpec {
  std::uint32_t protocol_version = kProtocolVersion;
  std::string job_id;
  std::string join_token;
  std::string host;
  std::int64_t pid = 0;
  int requested_rank = -1;  // -1: any
  int nproc = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  // Restarts, timeouts and hang handling; the first joiner's hold for the
  // job (job_policy.h).
  JobPolicy policy;
  int master_port = 0;
  std::string command;
  // Re-attach to a running round (see JoinRequest.resume_round); -1: join.
  std::int64_t resume_round = -1;
  std::string resume_node_id;
};

struct NodeInfo {
  int group_rank = 0;
  std::string host;
  std::int64_t pid = 0;
  int nproc = 0;
  int base_rank = 0;
};

struct Assignment {
  std::string job_id;
  std::int64_t round = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int base_rank = 0;
  int world_size = 0;
  int local_world_size = 0;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  std::string store_token;
  std::string node_id;
  // The job's policy (the first joiner's), for the agent to compare with
  // its own (PolicyWarning); nullopt from a server that does not send it.
  std::optional<JobPolicy> policy;
};

struct WorkerFailure {
  std::string host;
  int global_rank = -1;
  int local_rank = -1;
  int exit_code = 0;
  int signal = 0;
  std::int64_t pid = 0;
  double timestamp = 0;
  std::string stderr_tail;
  std::string error_message;
  std::int64_t round = 0;
  std::string log_file;  // the worker's log file on its host, "" without one
};

struct RestartRound {
  std::int64_t next_round = 0;
  std::string reason;
  bool counts_as_failure = false;
};

struct JobClosed {
  bool success = false;
  std::string reason;
  std::vector<WorkerFailure> failures;  // first failure first
};

// An event on an agent's Join stream. A Status ends the stream with an error
// (join timeout, job closed before the node was admitted, ...).
using RoundEvent = std::variant<Assignment, RestartRound, JobClosed, absl::Status>;

enum class Outcome { kSucceeded, kFailed, kLeaving };

struct JobStatus {
  std::string job_id;
  std::int64_t round = 0;
  std::string state;
  int restart_count = 0;
  std::vector<NodeInfo> nodes;
  int world_size = 0;
  int waiting = 0;
  // Hosts refused for now after repeated failures, each with the reason.
  std::vector<std::string> quarantined;
  // The job's --nnodes (0 before the first join fixed it).
  int min_nodes = 0;
  int max_nodes = 0;
  // While gathering: seconds until the first joined node's join timeout
  // fails the round (a fixed-size job waiting for a lost node's
  // replacement); 0 otherwise.
  double join_deadline_in_s = 0;
};

// What a store request names: the job, its store token (DDPRUN_TOKEN) and
// the round (DDPRUN_ROUND). The Store service serves one store per round.
struct StoreScope {
  std::string job_id;
  std::string token;
  std::int64_t round = 0;
};

}  // namespace ddprun::rendezvous
