#include "ddprun/agent/bandwidth_limit.h"

namespace ddprun::agent {

void BandwidthLimit::Take(std::uint64_t n) {
  if (bytes_per_s_ == 0 || n == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lifted_) return;  // unpaced work does not count against the pace after it
  }
  const auto cost = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(n) / static_cast<double>(bytes_per_s_)));
  const Clock::time_point now = Clock::now();
  // A caller slower than the rate starts from now: no credit builds up.
  if (next_ < now) next_ = now;
  const Clock::time_point start = next_;
  next_ += cost;
  if (start <= now) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, start, [this] { return lifted_; });
}

void BandwidthLimit::Lift(bool lifted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    lifted_ = lifted;
  }
  cv_.notify_all();
}

}  // namespace ddprun::agent
