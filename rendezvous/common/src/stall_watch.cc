#include "ddprun/rendezvous/common/stall_watch.h"

#include <utility>

namespace ddprun::rendezvous {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::int64_t NowTicks() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

constexpr std::int64_t Ticks(std::chrono::nanoseconds d) { return d.count(); }

}  // namespace

StallWatch::StallWatch(std::function<void(SteadyClock::duration)> on_stall)
    : on_stall_(std::move(on_stall)), last_wake_(NowTicks()) {
  thread_ = std::thread([this] { Run(); });
}

StallWatch::~StallWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool StallWatch::StalledRecently() const {
  const std::int64_t now = NowTicks();
  if (now - last_wake_.load() > Ticks(kStallTick + kStallThreshold)) return true;
  const std::int64_t end = stall_end_.load();
  return end != 0 && now - end < Ticks(kStallAftermath);
}

void StallWatch::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const std::int64_t before = last_wake_.load();
    cv_.wait_for(lock, kStallTick, [this] { return stop_; });
    const std::int64_t now = NowTicks();
    const std::int64_t late = now - before - Ticks(kStallTick);
    if (late >= Ticks(kStallThreshold)) {
      stall_end_.store(now);
      if (on_stall_) on_stall_(std::chrono::nanoseconds(now - before));
    }
    last_wake_.store(now);
  }
}

}  // namespace ddprun::rendezvous
