// The worker -> agent metrics channel (docs/monitoring-sources.md).
//
// One small shared file per worker, created by the agent (a memfd, named to
// the worker as /proc/<agent pid>/fd/<n> in DDPRUN_METRICS_FILE) with the
// header below already written. The worker maps it and writes with plain
// stores: a step is a handful of stores and no system call. The agent never
// maps it: once a second it copies it with pread(2), so a worker that
// truncates, grows or scribbles over the file can make a sample invalid but
// can never fault or stall the agent.
//
// Layout: fixed offsets, little-endian, version kChannelVersion. Three
// sections (progress, collectives, scalars), each guarded by its own
// sequence counter in the header (a seqlock): a writer makes the counter
// odd, writes the section, makes it even again. The reader copies the
// counters, the sections, the counters again, and keeps a section only when
// its counter was even and unchanged; otherwise it retries a few times and
// then keeps the previous copy. The Python writer (ddprun_metrics.py)
// writes the same offsets with struct.pack_into.
//
// Ownership: the first process that writes claims the channel (owner_pid),
// so that a subprocess inheriting the environment (a DataLoader worker
// started with "spawn", a helper script) leaves it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

inline constexpr char kChannelMagic[8] = {'D', 'D', 'P', 'R', 'M', 'E', 'T', '1'};
inline constexpr std::uint32_t kChannelVersion = 1;
inline constexpr int kChannelStepRing = 64;          // step durations kept per channel
inline constexpr int kChannelMaxOps = 16;            // collective kinds
inline constexpr int kChannelOpNameBytes = 16;       // incl. the NUL
inline constexpr int kChannelMaxScalars = 256;       // RankSample.scalars' limit
inline constexpr int kChannelScalarNameBytes = 120;  // incl. the NUL

// ChannelHeader.flags: what the writer provides.
inline constexpr std::uint32_t kChannelFlagProgress = 1;     // steps are counted
inline constexpr std::uint32_t kChannelFlagHook = 2;         // the Python start-up hook is active
inline constexpr std::uint32_t kChannelFlagCollectives = 4;  // SDK collectives are recorded
inline constexpr std::uint32_t kChannelFlagSamples = 8;      // samples_total is known

struct ChannelHeader {         // offset 0
  char magic[8];               // kChannelMagic (the agent writes it)
  std::uint32_t version;       // kChannelVersion
  std::uint32_t size;          // sizeof(ChannelLayout)
  std::int64_t owner_pid;      // the process that writes; 0: unclaimed
  std::uint32_t flags;         // kChannelFlag*
  std::int32_t stack_signal;   // > 0: faulthandler dumps Python stacks on it
  std::uint64_t progress_seq;  // seqlock of ProgressSection
  std::uint64_t comm_seq;      // seqlock of CommSection
  std::uint64_t scalars_seq;   // seqlock of ScalarsSection
  std::uint64_t reserved;
};

struct ProgressSection {  // offset 64
  std::int64_t steps;     // steps completed
  double samples_total;   // < 0: unknown
  // Step n's duration in seconds at [(n - 1) % kChannelStepRing]; NaN:
  // unknown (the first step of a process has no start).
  double step_seconds[kChannelStepRing];
};

struct ChannelOpStat {
  char op[kChannelOpNameBytes];  // "allreduce", ...
  std::int64_t count;
  std::int64_t bytes_total;
  double seconds_total;
  double busbw_gbps;  // of the most recent call
};

struct CommSection {            // offset 592
  std::int64_t collective_seq;  // collectives started
  std::uint32_t in_collective;  // 1: collective #collective_seq has not finished
  std::uint32_t current_op;     // its index in ops[]
  double comm_seconds_total;
  std::uint32_t num_ops;
  std::uint32_t pad;
  ChannelOpStat ops[kChannelMaxOps];
};

struct ChannelScalar {
  char name[kChannelScalarNameBytes];  // NUL-terminated, printable ASCII
  double value;
};

struct ScalarsSection {  // offset 1392
  std::uint32_t count;
  std::uint32_t pad;
  std::int64_t dropped;  // Scalar() calls refused: name too long or no slot left
  ChannelScalar slots[kChannelMaxScalars];
};

struct ChannelLayout {
  ChannelHeader header;
  ProgressSection progress;
  CommSection comm;
  ScalarsSection scalars;
};

static_assert(sizeof(ChannelHeader) == 64);
static_assert(offsetof(ChannelLayout, progress) == 64);
static_assert(offsetof(ChannelLayout, comm) == 592);
static_assert(offsetof(ChannelLayout, scalars) == 1392);
static_assert(sizeof(ChannelLayout) == 34176);

// The bytes the agent puts in a fresh channel file: the header, no data.
std::string InitialChannelBytes();

// Whether `name` may be a scalar's name: 1..kChannelScalarNameBytes-1 bytes
// of printable ASCII (no spaces). The same rule for writer and reader.
bool ValidChannelName(std::string_view name);

// ------------------------------------------------------------------ writer

// The worker's side: one per process, over a shared mapping. Thread-safe
// (a mutex per section; writers of different sections never wait for each
// other). Never makes a system call after Open.
class ChannelWriter {
 public:
  // Maps `path` (DDPRUN_METRICS_FILE) and claims it. An error when the file
  // cannot be mapped, has another layout, or another process owns it.
  static absl::StatusOr<std::unique_ptr<ChannelWriter>> Open(const std::string& path);
  ~ChannelWriter();

  // One step done, `samples` (< 0: unknown) in it, lasting `seconds` (NaN:
  // unknown).
  void Step(double samples, double seconds);
  // Sets a named scalar. False when refused (invalid or too long a name, or
  // kChannelMaxScalars names already set): counted in `dropped`.
  bool Scalar(std::string_view name, double value);
  // A collective starts / ends. End adds its bytes, duration and bus
  // bandwidth to its op's totals; `more_in_flight` (a GPU backend that
  // enqueues several before the first ends): a later one started and has not
  // ended, so the writer stays inside a collective.
  void CollectiveStart(std::string_view op);
  void CollectiveEnd(std::string_view op, std::int64_t bytes, double seconds, double busbw_gbps,
                     bool more_in_flight = false);
  void AddFlags(std::uint32_t flags);

 private:
  explicit ChannelWriter(ChannelLayout* map);
  int OpIndex(std::string_view op);  // under comm_mu_; -1 when full

  ChannelLayout* map_;
  std::mutex progress_mu_, comm_mu_, scalars_mu_;
  std::unordered_map<std::string, int> scalar_slots_;  // under scalars_mu_
};

// ------------------------------------------------------------------ reader

// A validated copy of a channel: everything in it is safe to report.
struct ChannelSnapshot {
  std::int64_t owner_pid = 0;
  std::uint32_t flags = 0;
  int stack_signal = 0;
  std::int64_t steps = 0;
  double samples_total = -1;
  std::vector<double> new_step_seconds;  // steps since the previous Read, oldest first
  std::int64_t collective_seq = 0;
  bool in_collective = false;
  std::string collective_op;
  double comm_seconds_total = 0;
  struct Op {
    std::string op;
    std::int64_t count = 0;
    std::int64_t bytes_total = 0;
    double seconds_total = 0;
    double busbw_gbps = 0;
  };
  std::vector<Op> ops;
  std::map<std::string, double> scalars;
  std::int64_t scalars_dropped = 0;  // the writer's refusals plus invalid slots
};

// The agent's side, over a file descriptor it owns. Not thread-safe.
class ChannelReader {
 public:
  explicit ChannelReader(int fd) : fd_(fd) {}
  // Copies and validates the channel. An error (one line, for the log) when
  // the header is not a channel's; invalid values in a section are dropped,
  // counters never go backwards (a lower value is ignored), and a section
  // that a writer keeps changing keeps its previous copy. Never blocks.
  absl::StatusOr<ChannelSnapshot> Read();
  // Problems seen since the last call ("steps went backwards ..."), for
  // one log line each.
  std::vector<std::string> TakeWarnings();

 private:
  int fd_;
  ChannelSnapshot last_;
  std::int64_t last_steps_reported_ = 0;
  std::vector<std::string> warnings_;
  bool warned_steps_ = false, warned_seq_ = false;
};

}  // namespace ddprun::rendezvous
