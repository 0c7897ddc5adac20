// Which collectives of the NCCL backend are timed on the device, and the
// duration recorded for those that are not (docs/monitoring-sources.md).
//
// Why sample: a CUDA timing event holds its stream back. On an H100 an event
// recorded after a timing event is seen done 5-6 us later, and recording one
// costs the host 1.4 us instead of 0.3 (docs/gpu.md); timing every
// collective cost 5-8 us per collective. So a collective is timed when its
// size class (op, and bytes from 2^k to 2^(k+1) - 1) has no measured
// duration yet, or when `period` has passed since the last timed launch;
// every other collective is given the last measured duration of its class.
// Counts and bytes stay exact; durations, and the bus bandwidth derived from
// them, are estimates for the untimed ones.
//
// No CUDA here: the backend asks, records the events, and reports what they
// measured; the clock is passed in, so the policy is unit-tested without a
// device or sleeps. Not thread-safe (the backend's launch lock covers it).
#pragma once

#include <bit>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace ddp::detail {

class DurationSampler {
 public:
  using Clock = std::chrono::steady_clock;

  // At most one timed collective per `period`, besides each class's first:
  // with two timing events of ~5 us each, at most 1 % of the stream's time.
  static constexpr Clock::duration kDefaultPeriod = std::chrono::milliseconds(1);

  explicit DurationSampler(Clock::duration period = kDefaultPeriod) : period_(period) {}

  // Whether a collective of `op` over `bytes`, launched at `now`, should get
  // timing events. Call Timed(now) once they are recorded.
  // (The very first is timed: no class has a duration yet.)
  bool ShouldTime(std::string_view op, std::int64_t bytes, Clock::time_point now) const {
    return now - last_timed_ >= period_ || !measured_.contains(ClassOf(op, bytes));
  }
  void Timed(Clock::time_point now) { last_timed_ = now; }

  // A timed collective's device time, once its events say.
  void Measured(std::string_view op, std::int64_t bytes, double seconds) {
    measured_[ClassOf(op, bytes)] = seconds;
  }

  // The duration to record for an untimed collective: the last measured one
  // of its class; 0 when none has been measured yet.
  double Estimate(std::string_view op, std::int64_t bytes) const {
    auto it = measured_.find(ClassOf(op, bytes));
    return it == measured_.end() ? 0 : it->second;
  }

 private:
  // (op, bit width of bytes): 0 B, 1 B, 2-3 B, 4-7 B, ... each a class.
  using SizeClass = std::pair<std::string, int>;
  static SizeClass ClassOf(std::string_view op, std::int64_t bytes) {
    const auto b = static_cast<std::uint64_t>(bytes < 0 ? 0 : bytes);
    return {std::string(op), static_cast<int>(std::bit_width(b))};
  }

  const Clock::duration period_;
  Clock::time_point last_timed_{};
  std::map<SizeClass, double> measured_;
};

}  // namespace ddp::detail
