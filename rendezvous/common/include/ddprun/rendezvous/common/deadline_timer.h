// A thread that sleeps until the next deadline and then runs a callback: the
// daemon's timer for the job table (round timeouts, store waits, retention).
// It does not tick: it waits for next() with a condition variable and is
// woken early only by Notify() of an earlier deadline.
//
// Thread-safe. The callbacks run on the timer's thread, never under its lock.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

class DeadlineTimer {
 public:
  // next(): the earliest pending deadline (nullopt: none). fire(): applies
  // every deadline that passed, so that next() moves on. Starts the thread,
  // which runs fire() and then waits for next().
  DeadlineTimer(const Clock& clock, std::function<std::optional<TimePoint>()> next,
                std::function<void()> fire);
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;
  ~DeadlineTimer();  // Stop()

  // A deadline at `deadline` may now exist: the thread wakes up if it waits
  // for a later one (or for none). Cheap when it does not.
  void Notify(TimePoint deadline);
  // Ends the thread (after a fire() in progress returns). Idempotent.
  void Stop();

 private:
  void Run();

  const Clock& clock_;
  const std::function<std::optional<TimePoint>()> next_;
  const std::function<void()> fire_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool computing_ = true;              // in fire()/next(): every Notify counts
  std::optional<TimePoint> target_;    // what the thread waits for
  std::optional<TimePoint> notified_;  // earliest Notify() not yet folded into target_
  std::thread thread_;
};

}  // namespace ddprun::rendezvous
