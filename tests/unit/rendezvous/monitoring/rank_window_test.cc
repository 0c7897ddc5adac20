// The metrics hub's per-rank windows (rendezvous/monitoring/src/rank_window.h): the step
// window is a ring that allocates on its first value, the rate window keeps
// the reports of its time window plus one.
#include "rank_window.h"

#include <catch2/catch.hpp>

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST_CASE("step window: quantiles over the newest values after the ring wraps", "[metrics]") {
  StepWindow w(4);
  CHECK(w.size() == 0);
  CHECK(w.Quantile(0.5) == -1);
  for (double x : {1.0, 2.0, 3.0}) w.Add(x);
  CHECK(w.size() == 3);
  CHECK(w.Quantile(0) == 1);
  CHECK(w.Quantile(0.99) == 3);
  CHECK(w.Quantile(0, 2) == 2);  // the newest two: 2, 3
  // Wrap twice over: 10..16 leave 13, 14, 15, 16.
  for (int i = 10; i <= 16; ++i) w.Add(i);
  CHECK(w.size() == 4);
  CHECK(w.Quantile(0) == 13);
  CHECK(w.Quantile(0.99) == 16);
  CHECK(w.Quantile(0, 1) == 16);
  CHECK(w.Quantile(0, 3) == 14);  // the newest three: 14, 15, 16
  CHECK(w.Quantile(0.5, 100) == 15);
  w.Clear();
  CHECK(w.size() == 0);
  w.Add(7);
  CHECK(w.Quantile(0.5) == 7);
}

TEST_CASE("rate window: steps per second over the window, then 0 once silent", "[metrics]") {
  RateWindow w(10s);
  const TimePoint t0{};
  CHECK(w.StepsPerSecond(t0) == 0);
  for (int i = 0; i <= 30; ++i) w.Add(t0 + std::chrono::seconds(i), 5.0 * i, -1);
  // The last 10 s plus the report before them: 5 steps a second.
  CHECK(w.StepsPerSecond(t0 + 30s) == Approx(5));
  CHECK(w.SamplesPerSecond(t0 + 30s) == -1);
  CHECK(w.StepsPerSecond(t0 + 51s) == 0);  // older than two windows
}

}  // namespace
}  // namespace ddprun::rendezvous
