// The pace of the agent's background checkpoint I/O (bandwidth_limit.h):
// chunks go at the rate on average, a slow caller earns no burst, 0 is no
// limit, and Lift (a flush the job waits for) ends the pacing at once.
#include "ddprun/agent/bandwidth_limit.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace ddprun::agent {
namespace {

using Clock = BandwidthLimit::Clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST_CASE("BandwidthLimit paces chunks at the rate", "[unit][bandwidth]") {
  BandwidthLimit pace(40 << 20);  // 40 MiB/s: a 4 MiB chunk is 0.1 s
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) pace.Take(4 << 20);
  // The first chunk goes at once, each next one 0.1 s after the previous.
  CHECK(SecondsSince(t0) >= 0.4 - 0.01);
}

TEST_CASE("BandwidthLimit: 0 is no limit, and Lift ends the pacing", "[unit][bandwidth]") {
  BandwidthLimit none(0);
  auto t0 = Clock::now();
  for (int i = 0; i < 1000; ++i) none.Take(1 << 30);
  CHECK(SecondsSince(t0) < 1.0);

  BandwidthLimit slow(1 << 20);       // 1 MiB/s
  slow.Take(std::uint64_t{1} << 30);  // the first chunk goes at once; the next would wait 1024 s
  slow.Lift(true);
  t0 = Clock::now();
  slow.Take(1 << 20);
  CHECK(SecondsSince(t0) < 1.0);
  slow.Lift(false);
  CHECK(slow.bytes_per_s() == 1 << 20);
}

TEST_CASE("BandwidthLimit: Lift ends a Take that waits", "[unit][bandwidth]") {
  BandwidthLimit slow(1);  // 1 byte/s: the second Take would wait about 12 days
  slow.Take(1 << 20);
  const auto t0 = Clock::now();
  std::thread lifter([&] {
    // The flush's side: it lifts the pace while the writer waits.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    slow.Lift(true);
  });
  slow.Take(1 << 20);
  lifter.join();
  CHECK(SecondsSince(t0) < 10.0);
}

TEST_CASE("BandwidthLimit: a slow caller earns no burst", "[unit][bandwidth]") {
  BandwidthLimit pace(40 << 20);
  pace.Take(4 << 20);
  // Work slower than the rate (0.3 s for a 0.1 s chunk), then three
  // chunks: the first goes at once, the next two 0.1 s apart, not at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the caller's own work
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) pace.Take(4 << 20);
  CHECK(SecondsSince(t0) >= 0.2 - 0.01);
}

}  // namespace
}  // namespace ddprun::agent
