// The NCCL backend's sampling of collective durations (duration_sampler.h),
// in simulated time: which collectives get timing events, and what the
// others record.
#include "duration_sampler.h"

#include <catch2/catch.hpp>
#include <chrono>

namespace {

using ddp::detail::DurationSampler;
using std::chrono::microseconds;
using std::chrono::milliseconds;

const DurationSampler::Clock::time_point kT0{std::chrono::seconds(100)};

TEST_CASE("duration sampler: the first collective is timed, then one per period", "[unit]") {
  DurationSampler s(milliseconds(1));
  REQUIRE(s.ShouldTime("allreduce", 4096, kT0));
  s.Timed(kT0);
  s.Measured("allreduce", 4096, 20e-6);
  // Same class within the period: not timed; its duration is the class's last.
  CHECK_FALSE(s.ShouldTime("allreduce", 4096, kT0 + microseconds(999)));
  CHECK(s.Estimate("allreduce", 4096) == 20e-6);
  // A period after the last timed launch: timed again.
  CHECK(s.ShouldTime("allreduce", 4096, kT0 + milliseconds(1)));
  s.Timed(kT0 + milliseconds(1));
  s.Measured("allreduce", 4096, 30e-6);
  CHECK_FALSE(s.ShouldTime("allreduce", 4096, kT0 + microseconds(1500)));
  CHECK(s.Estimate("allreduce", 4096) == 30e-6);
}

TEST_CASE("duration sampler: a new op or size class is timed at once", "[unit]") {
  DurationSampler s(milliseconds(1));
  s.Timed(kT0);
  s.Measured("allreduce", 1000, 10e-6);  // class 512-1023 bytes
  const auto soon = kT0 + microseconds(10);
  CHECK_FALSE(s.ShouldTime("allreduce", 1023, soon));
  CHECK_FALSE(s.ShouldTime("allreduce", 512, soon));
  CHECK(s.ShouldTime("allreduce", 1024, soon));  // the next power of two
  CHECK(s.ShouldTime("allreduce", 511, soon));
  CHECK(s.ShouldTime("broadcast", 1000, soon));  // another op
  CHECK(s.Estimate("allreduce", 700) == 10e-6);
  CHECK(s.Estimate("allreduce", 2000) == 0);  // nothing measured in that class
  CHECK(s.Estimate("broadcast", 1000) == 0);
}

TEST_CASE("duration sampler: a class timed but not yet measured is timed again", "[unit]") {
  // Collectives launched back to back before the first one's events are read
  // all get events until a duration of their class is known.
  DurationSampler s(milliseconds(1));
  s.Timed(kT0);
  CHECK(s.ShouldTime("allgather", 1 << 20, kT0 + microseconds(1)));
  s.Measured("allgather", 1 << 20, 1e-4);
  CHECK_FALSE(s.ShouldTime("allgather", 1 << 20, kT0 + microseconds(2)));
}

TEST_CASE("duration sampler: zero and negative byte counts share the lowest class", "[unit]") {
  DurationSampler s;
  s.Timed(kT0);
  s.Measured("barrier", 0, 5e-6);
  CHECK_FALSE(s.ShouldTime("barrier", 0, kT0 + microseconds(1)));
  CHECK(s.Estimate("barrier", -1) == 5e-6);
  CHECK(s.Estimate("barrier", 1) == 0);  // 1 byte is the next class
}

}  // namespace
