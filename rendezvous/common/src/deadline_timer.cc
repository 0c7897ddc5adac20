#include "ddprun/rendezvous/common/deadline_timer.h"

#include <algorithm>
#include <utility>

namespace ddprun::rendezvous {
namespace {

// A deadline that fire() left pending (a bug elsewhere) is retried after
// this long instead of being spun on.
constexpr Duration kStuckRetry = std::chrono::milliseconds(10);

std::optional<TimePoint> Earlier(std::optional<TimePoint> a, std::optional<TimePoint> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

}  // namespace

DeadlineTimer::DeadlineTimer(const Clock& clock, std::function<std::optional<TimePoint>()> next,
                             std::function<void()> fire)
    : clock_(clock), next_(std::move(next)), fire_(std::move(fire)) {
  thread_ = std::thread([this] { Run(); });
}

DeadlineTimer::~DeadlineTimer() { Stop(); }

void DeadlineTimer::Notify(TimePoint deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  // While next() runs, it may or may not see this deadline: keep it.
  if (!computing_ && target_ && *target_ <= deadline) return;
  notified_ = Earlier(notified_, deadline);
  cv_.notify_one();
}

void DeadlineTimer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void DeadlineTimer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    computing_ = true;
    lock.unlock();
    const TimePoint fired_at = clock_.Now();
    fire_();
    std::optional<TimePoint> next = next_();
    if (next && *next <= fired_at) next = fired_at + kStuckRetry;
    lock.lock();
    computing_ = false;
    target_ = next;
    // Sleep until target_ passes; an earlier Notify() moves target_ forward.
    while (!stop_) {
      target_ = Earlier(target_, notified_);
      notified_.reset();
      if (!target_) {
        cv_.wait(lock, [&] { return stop_ || notified_.has_value(); });
        continue;
      }
      const Duration left = *target_ - clock_.Now();
      if (left <= Duration::zero()) break;
      cv_.wait_for(lock, left, [&] { return stop_ || (notified_ && *notified_ < *target_); });
    }
  }
}

}  // namespace ddprun::rendezvous
