// --ckpt_dir (docs/checkpoint.md, "Persistence"): the agent writes its
// workers' committed snapshots to a directory, off the workers' path, and a
// job started on that directory resumes from it.
//
//   DIR/step-<N>/rank-<RANK>.safetensors   checkpoint_file.h's format
//   DIR/step-<N>/manifest-<FIRST>-<LAST>.json
//       {"format": "ddprun-checkpoint-1", "step": N, "world_size": W,
//        "ranks": {"<RANK>": {"file", "size", "crc32"}, ...}}
//
// Each agent writes the ranks of its node (FIRST..LAST) and one manifest
// for them; a step is complete when the manifests in its folder name every
// rank 0..W-1. Every file is written to a temporary name, fsynced and
// renamed, the manifest last, so a step folder never names a partial file.
// After a step is complete, the folders of older steps are removed; an
// agent also removes its own files of steps older than the two it wrote
// last (a directory only one node of several sees never completes a step).
//
// A background thread polls the commit records (every kPollInterval) and
// persists the newest step that every local rank committed; Flush persists
// it now (SIGTERM, the job's end) within a deadline. A write that fails (a
// full disk) is one line; the snapshot stays in memory and the job goes on.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "ddprun/agent/background_priority.h"
#include "ddprun/agent/bandwidth_limit.h"
#include "ddprun/agent/checkpoint_memory.h"

namespace ddprun::agent {

class CheckpointPersister {
 public:
  using Clock = std::chrono::steady_clock;
  using LogFn = std::function<void(const std::string&)>;  // one line, from any thread
  static constexpr std::chrono::milliseconds kPollInterval{200};

  // `memory` outlives this object. `bandwidth`: the background writes'
  // bytes per second (--ckpt_bandwidth; 0: no limit); from a Flush or
  // RequestFlush until it is served nothing is paced. `background` (may be
  // null; outlives this object): the thread, "ckpt-persist", joins it and
  // runs on its CPUs.
  CheckpointPersister(std::string dir, const CheckpointMemory* memory, LogFn log,
                      std::uint64_t bandwidth = 0, BackgroundThreads* background = nullptr);
  ~CheckpointPersister();  // stops the thread; a write in progress is abandoned
  CheckpointPersister(const CheckpointPersister&) = delete;
  CheckpointPersister& operator=(const CheckpointPersister&) = delete;

  // Creates DIR (an error names it) and starts the background thread.
  absl::Status Start();

  // Persists the newest step every local rank committed, if not yet done,
  // waiting until `deadline`. Says which step the directory holds, or that
  // the deadline passed (the write is abandoned; the older step stays).
  void Flush(Clock::time_point deadline, const std::string& why);
  // Starts a Flush's work without waiting for it.
  void RequestFlush();

  // Before the round's first workers start, when the memory holds no
  // snapshot: loads local ranks [0, local_ranks) as RANK base_rank + j of a
  // job of world_size ranks from the newest complete step in DIR that
  // matches, into `memory`. A corrupt or foreign file is refused by name
  // and an older complete step tried; one line says what the job resumes
  // from, or that it starts fresh. Main thread only.
  void Restore(CheckpointMemory* memory, int local_ranks, int base_rank, int world_size);

  // The newest step in DIR written or restored by this agent; kNone before.
  static constexpr std::int64_t kNone = INT64_MIN;
  std::int64_t persisted_step() const { return persisted_step_.load(); }

 private:
  enum class Outcome { kNothing, kWritten, kRetry, kFailed };
  void Loop();
  Outcome PersistNewest(bool flushing);
  void Prune(std::int64_t complete_step);

  const std::string dir_;
  const CheckpointMemory* memory_;
  LogFn log_;
  BackgroundThreads* background_;
  BandwidthLimit pace_;  // Take: the thread's; Lift: under mu_
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t flush_requests_ = 0;          // guarded by mu_
  std::uint64_t requests_served_ = 0;         // guarded by mu_
  Outcome last_outcome_ = Outcome::kNothing;  // of the last served request, guarded by mu_
  std::int64_t reported_step_ = kNone;        // Flush's last line (the main thread's)
  std::atomic<bool> cancel_{false};           // abandons the write in progress
  // The last snapshot read (the thread's own): the next one is read into its
  // memory rather than into fresh pages, which cost the workers' cores here.
  std::string buffer_;
  std::atomic<std::int64_t> persisted_step_{kNone};
  std::int64_t failed_step_ = kNone;       // the thread's own: not retried until a newer step
  std::int64_t previous_written_ = kNone;  // the thread's own: the step written before
  bool failing_ = false;                   // the thread's own: one line when writes start failing
  std::string last_failure_;               // guarded by mu_: why the last write failed
};

}  // namespace ddprun::agent
