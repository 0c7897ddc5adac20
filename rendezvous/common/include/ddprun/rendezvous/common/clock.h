// Time behind an interface so that timeout logic is tested without sleeping.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace ddprun::rendezvous {

using Duration = std::chrono::steady_clock::duration;
using TimePoint = std::chrono::steady_clock::time_point;

// A monotonic clock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

// The real steady clock.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance.
  static const Clock& Get() {
    static const SystemClock clock;
    return clock;
  }
};

// A clock that only moves when told to. For tests.
class FakeClock final : public Clock {
 public:
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  TimePoint now_{std::chrono::hours(1)};
};

// The local wall-clock time `from_now` after now, "HH:MM:SS", for messages
// that tell a person until when something waits.
std::string WallClockAfter(Duration from_now);

inline Duration Seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace ddprun::rendezvous
