// The daemon's timer: it fires when the deadline that next() names has
// passed, and a Notify() of an earlier deadline wakes it. The clock is fake,
// so every deadline here is either already past or far away: the test waits
// on a condition (bounded), never sleeps.
#include "ddprun/rendezvous/common/deadline_timer.h"

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

// A deadline the timer holds in a table-like place; fire() clears it when due.
struct Deadlines {
  explicit Deadlines(const Clock& c) : clock(c) {}

  std::optional<TimePoint> Next() {
    std::lock_guard<std::mutex> lock(mu);
    return pending;
  }
  void Fire() {
    std::lock_guard<std::mutex> lock(mu);
    if (pending && *pending <= clock.Now()) {
      pending.reset();
      ++fired;
      cv.notify_all();
    }
  }
  void Set(TimePoint t) {
    std::lock_guard<std::mutex> lock(mu);
    pending = t;
  }
  // Waits (bounded) until fired reaches n.
  bool WaitFired(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 10s, [&] { return fired >= n; });
  }

  const Clock& clock;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<TimePoint> pending;
  int fired = 0;
};

TEST_CASE("DeadlineTimer fires a deadline that has passed", "[unit]") {
  FakeClock clock;
  Deadlines d(clock);
  d.Set(clock.Now());
  DeadlineTimer timer(
      clock, [&] { return d.Next(); }, [&] { d.Fire(); });
  CHECK(d.WaitFired(1));
}

TEST_CASE("DeadlineTimer waits for a far deadline until a Notify names an earlier one", "[unit]") {
  FakeClock clock;
  Deadlines d(clock);
  d.Set(clock.Now() + 1h);  // the timer now waits (an hour of real time)
  DeadlineTimer timer(
      clock, [&] { return d.Next(); }, [&] { d.Fire(); });
  // A new deadline that is due now: without the Notify the timer would
  // sleep for the hour, and WaitFired would time out.
  d.Set(clock.Now());
  timer.Notify(clock.Now());
  CHECK(d.WaitFired(1));
  timer.Stop();
  CHECK(d.fired == 1);
}

TEST_CASE("DeadlineTimer with nothing pending sleeps until notified, and stops", "[unit]") {
  FakeClock clock;
  Deadlines d(clock);
  DeadlineTimer timer(
      clock, [&] { return d.Next(); }, [&] { d.Fire(); });
  d.Set(clock.Now());
  timer.Notify(clock.Now());
  CHECK(d.WaitFired(1));
  timer.Stop();
  timer.Stop();  // idempotent
}

}  // namespace
}  // namespace ddprun::rendezvous
