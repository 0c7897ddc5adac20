// A pace for the agent's background checkpoint I/O (the --ckpt_dir
// persister's writes, the --ckpt_replicas sender's sends): at most
// `bytes_per_s` on average, so that the copy spreads over time instead of
// taking a core's worth of memory bandwidth and CPU at once while the
// workers train (docs/checkpoint.md, "Background priority"). Take is for
// one thread; Lift from any. Each Take waits at most one chunk's time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace ddprun::agent {

class BandwidthLimit {
 public:
  using Clock = std::chrono::steady_clock;
  // 0: no limit (Take returns at once).
  explicit BandwidthLimit(std::uint64_t bytes_per_s) : bytes_per_s_(bytes_per_s) {}

  // Call before moving `n` bytes (a chunk; keep it small, a few MiB, so that
  // the sleeps stay short): sleeps until the previous chunks' time at the
  // rate has passed. Time not used (the caller was slower) is not saved up
  // beyond one chunk, so a pause never turns into a burst.
  void Take(std::uint64_t n);

  // While lifted, Take returns at once, and a Take waiting now returns:
  // work the job waits for (a flush on SIGTERM or at the job's end, the
  // agent's exit) is never paced, even midway.
  void Lift(bool lifted);

  std::uint64_t bytes_per_s() const { return bytes_per_s_; }

 private:
  const std::uint64_t bytes_per_s_;
  Clock::time_point next_{};  // Take's own
  std::mutex mu_;
  std::condition_variable cv_;
  bool lifted_ = false;  // under mu_
};

}  // namespace ddprun::agent
