// `ddprun check`'s judgement: what each node found (NodeFacts, plain data that
// travels through the job's store as JSON) and the checks that turn the facts
// of every node into pass / warn / fail with a fix.
//
// Contract:
//  - A check is a pure function of the facts: no file system, no sockets, no
//    clock. The probes that gather facts are elsewhere (preflight_probe.h),
//    so every verdict is unit-tested with hand-written facts.
//  - Group rank 0's worker runs every check for every node (cross-node
//    checks compare a node with node 0, the reference).
//  - Exit code of the report: 0 every line pass or n/a, kExitCheckWarnings
//    when the worst line is warn, kExitCheckFailed when any line fails
//    (rendezvous/exit_codes.h).
//  - Thresholds are named below and documented in docs/check.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::launcher::preflight {

inline constexpr std::int64_t kMiB = 1024 * 1024;
// The SDK's shared-memory segments: 2 MiB per local rank plus 2 MiB.
inline constexpr std::int64_t kShmPerRankBytes = 2 * kMiB;
inline constexpr std::int64_t kShmBaseBytes = 2 * kMiB;
// Below this much free /dev/shm, PyTorch's DataLoader workers (which pass
// every batch through shared memory) die with "bus error" on ordinary
// batches; Docker's default is 64 MiB.
inline constexpr std::int64_t kShmDataLoaderBytes = 1024 * kMiB;
// torch 1.13 opens 2 store connections per worker on the master; the agent
// and the worker need some more of their own.
inline constexpr std::int64_t kNofilePerWorker = 2;
inline constexpr std::int64_t kNofileBase = 64;
// Below this, DataLoader workers, NCCL and checkpoints run out of files.
inline constexpr std::int64_t kNofileComfortable = 4096;
// Clock offset to node 0 beyond the measurement's uncertainty.
inline constexpr double kClockWarnMs = 100.0;
inline constexpr double kClockFailMs = 1000.0;

enum class Verdict { kPass, kNotApplicable, kWarn, kFail };
std::string_view VerdictName(Verdict v);  // "pass", "n/a", "warn", "fail"

struct Interface {
  std::string name;
  bool up = false;
  bool has_address = false;  // an IPv4 or IPv6 address (NCCL skips the others)
};

// One TCP connection a node tried to open, with its deadline.
struct Reach {
  std::string what;     // "rendezvous", "store", "node 1"
  std::string address;  // host:port
  bool ok = false;
  std::string error;  // when !ok
  double ms = 0;      // connect time when ok
};

struct Resolved {
  std::string name;
  bool ok = false;
  std::string error;
};

// What one node found. Fields a node could not measure keep their "unknown"
// value and the check says n/a or fail as documented per check.
struct NodeFacts {
  bool reported = false;  // false: the node sent nothing before the deadline
  int group_rank = 0;
  std::string host;      // the address it advertises (the rendezvous' DDPRUN_HOST)
  std::string hostname;  // gethostname(2)
  std::string error;     // when !reported: why, if known
  // The variables the checks read, those that are set (NCCL_SOCKET_IFNAME,
  // GLOO_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_DISABLE, CUDA_VISIBLE_DEVICES).
  std::map<std::string, std::string> env;
  std::vector<Interface> interfaces;
  std::optional<std::vector<std::string>> ib_devices;  // nullopt: no /sys/class/infiniband
  int gpu_count = 0;
  std::string gpu_source;  // "nvml", "/proc/driver/nvidia", "none"
  int cpu_count = 0;
  std::int64_t shm_total = -1;  // bytes; -1: no /dev/shm
  std::int64_t shm_free = -1;
  std::int64_t nofile_soft = -1;   // -1: unlimited
  std::int64_t memlock_soft = -1;  // bytes; -1: unlimited
  std::string ddprun_version;
  // The file that would run: empty path when there is none to checksum
  // (python -m MODULE, a command found on PATH is still checksummed).
  std::string script_path;
  std::string script_sha256;
  std::string script_error;
  bool python_command = false;  // the worker command runs a Python interpreter
  std::string python_exec;      // that interpreter, as the command names it
  // The script has an `import torch` / `from torch ...` line: it needs a
  // torch the interpreter can import (ScriptImportsTorch).
  bool script_imports_torch = false;
  std::string python_version;  // "" with python_error set: it did not run
  std::string torch_version;   // "": torch is not importable
  std::string python_error;
  std::vector<Resolved> resolved;
  std::vector<Reach> reach;
  bool clock_measured = false;  // false on node 0 (the reference)
  double clock_offset_ms = 0;   // this node's clock minus node 0's
  double clock_uncertainty_ms = 0;
};

// The job as its launcher sees it (the user's flags, not the check's own
// one worker per node).
struct JobFacts {
  std::string job_id;
  int nproc_per_node = 1;
  int nnodes = 1;  // nodes in this round
  int WorldSize() const { return nproc_per_node * nnodes; }
};

struct CheckResult {
  std::string check;
  int node = 0;
  Verdict verdict = Verdict::kPass;
  std::string detail;  // what was found, one line
  std::string fix;     // on warn and fail: what to do, one line
};

// One check: a name (stable; the JSON key) and a verdict for one node.
class Check {
 public:
  virtual ~Check() = default;
  virtual std::string_view Name() const = 0;
  // `all` holds every node's facts indexed by group rank; all[0] is the
  // reference for cross-node comparisons.
  virtual CheckResult Run(const NodeFacts& node, const std::vector<NodeFacts>& all,
                          const JobFacts& job) const = 0;
};

// Every check, in the order of the table.
std::vector<std::unique_ptr<Check>> DefaultChecks();

// How NCCL reads NCCL_SOCKET_IFNAME / NCCL_IB_HCA: "^" excludes the list,
// "=" matches names exactly, otherwise each entry is a prefix; ":port" is
// stripped. Returns whether `name` is selected.
bool NcclListSelects(absl::string_view list, absl::string_view name);
// How CUDA reads CUDA_VISIBLE_DEVICES: indices (parsing stops at the first
// invalid or out-of-range one), GPU-/MIG- UUIDs; "" or "-1" hides every GPU.
// `invalid` gets the first entry CUDA would stop at, if any.
int VisibleGpus(absl::string_view cuda_visible_devices, int physical, std::string* invalid);

struct Report {
  JobFacts job;
  std::vector<NodeFacts> nodes;
  std::vector<CheckResult> results;  // node by node, checks in table order
};

Report RunChecks(const std::vector<NodeFacts>& nodes, const JobFacts& job,
                 const std::vector<std::unique_ptr<Check>>& checks);
int ExitCode(const Report& report);
// The table: one line per node and check, the fix on the line after a warn
// or fail, then a summary line.
std::string FormatText(const Report& report);
std::string FormatJson(const Report& report);
// "2 nodes: 25 pass, 1 warn, 0 fail" for the nodes that do not print the table.
std::string Summary(const Report& report);

// The facts on the wire (the job's store).
std::string FactsToJson(const NodeFacts& facts);
absl::StatusOr<NodeFacts> FactsFromJson(std::string_view json);

}  // namespace ddprun::launcher::preflight
