// Domain types of the monitoring protocol (proto "Monitoring" section):
// what an agent reports about its node's workers every second and what the
// server answers. proto_convert.cc maps them to and from ddprun.v1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous {

struct CollectiveStat {
  std::string op;
  std::int64_t count = 0;
  std::int64_t bytes_total = 0;
  double seconds_total = 0;
  double busbw_gbps = 0;
};

// One worker as its agent saw it (see RankSample in ddprun.proto).
struct RankSample {
  int rank = -1;
  int local_rank = -1;
  std::int64_t pid = 0;
  std::string state;  // "running" | "exited" | "failed" | "stopped"
  bool has_progress_source = false;
  std::int64_t steps = 0;
  std::vector<double> step_seconds;  // steps completed since the last report
  double samples_total = -1;         // < 0: unknown
  std::int64_t collective_seq = 0;
  bool in_collective = false;
  std::string collective_op;
  double comm_seconds_total = 0;
  std::vector<CollectiveStat> collectives;
  std::map<std::string, double> scalars;
  std::int64_t scalars_dropped = 0;
  double cpu_percent = 0;
  std::uint64_t rss_bytes = 0;
  double gpu_util_percent = -1;  // < 0: n/a
  std::uint64_t gpu_mem_bytes = 0;
  // The worker has a connection to its round's store: it reached
  // init_process_group (sticky for the round).
  bool reached_store = false;
  // The worker's checkpoint memory (RankSample in ddprun.proto): the newest
  // committed step and its bytes (when has_checkpoint), the memory held.
  bool has_checkpoint = false;
  std::int64_t checkpoint_step = 0;
  std::uint64_t checkpoint_bytes = 0;
  std::uint64_t checkpoint_memory_bytes = 0;
};

struct StackDump {
  int rank = -1;
  std::int64_t pid = 0;
  std::string host;
  std::string kind;  // "python" | "native" | "kernel"
  std::string text;
  std::string error;  // why there is no stack
};

// Bounds of MetricsReport::store_waits (more is cut, never an error).
inline constexpr std::size_t kMaxStoreWaitKeys = 16;
inline constexpr std::size_t kMaxStoreKeyBytes = 256;

// One restart's recovery budget on one node (docs/recovery.md): the time
// from the failure's detection to each phase, in milliseconds; < 0 = the
// phase was not reached. The agent's RecoveryTracker fills it; job-wide and
// (later) in-place restarts fill the same record.
struct RecoveryBudget {
  std::int64_t failed_round = 0;  // the round that failed
  std::int64_t round = 0;         // the round it recovered into; 0 = none formed
  std::string cause;              // "worker rank 1 exited with signal SIGKILL", a restart's reason
  double stopped_ms = -1;         // the last local worker reaped
  double round_ms = -1;           // the new round's assignment received
  double started_ms = -1;         // every local worker spawned
  double first_step_ms = -1;      // a step of any local rank of the new round completed
  // "recovered" (first step seen), "pending" (still waiting), "superseded"
  // (another failure first), "no first step" (the job ended first).
  std::string outcome = "pending";
};

struct MetricsReport {
  std::string job_id;
  std::string node_id;
  std::int64_t round = 0;
  std::string host;
  double unix_s = 0;
  std::vector<RankSample> ranks;
  std::vector<StackDump> stacks;
  std::vector<std::string> events;
  // From the node hosting the round's store: the keys workers wait for there
  // that nobody has set yet.
  std::vector<std::string> store_waits;
  // The node's latest finished recovery (sent until the next restart).
  std::optional<RecoveryBudget> recovery;
};

struct MetricsReply {
  std::vector<int> capture_stacks;  // global ranks on the reporting node
  std::string hang_report;          // print once
};

}  // namespace ddprun::rendezvous
