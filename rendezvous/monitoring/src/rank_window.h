// Sliding windows over one rank's progress, for the metrics hub: the last N
// step durations (quantiles, the straggler median) and the (time, steps,
// samples) points of its recent reports (rates). No locking; the hub's lock
// covers them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

// The last `capacity` values in a ring. Allocates on the first Add, not
// before: a round of 16k nodes makes one per rank (131k with 8 ranks a node)
// under the job table's lock, and most are never written in the first seconds.
class StepWindow {
 public:
  explicit StepWindow(std::size_t capacity) : capacity_(std::max<std::size_t>(1, capacity)) {}
  void Add(double seconds) {
    if (values_.size() < capacity_) {
      if (values_.empty()) values_.reserve(capacity_);
      values_.push_back(seconds);
      return;
    }
    values_[next_] = seconds;  // overwrite the oldest
    next_ = (next_ + 1) % capacity_;
  }
  std::size_t size() const { return values_.size(); }
  void Clear() {
    values_.clear();
    next_ = 0;
  }
  // The q-quantile (nearest rank) of the last `last` values (0: all); -1 when empty.
  double Quantile(double q, std::size_t last = 0) const {
    if (values_.empty()) return -1;
    const std::size_t size = values_.size();
    const std::size_t n = last == 0 ? size : std::min(last, size);
    // Oldest at next_ once full, at 0 before: the newest n end just before it.
    std::vector<double> v;
    v.reserve(n);
    const std::size_t end = values_.size() < capacity_ ? size : next_;
    for (std::size_t i = 0; i < n; ++i) v.push_back(values_[(end + size - n + i) % size]);
    const std::size_t k = std::min(n - 1, static_cast<std::size_t>(q * static_cast<double>(n)));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }

 private:
  std::size_t capacity_;
  std::vector<double> values_;  // a ring once full
  std::size_t next_ = 0;        // once full: the oldest value, overwritten next
};

// Rates from cumulative counters, over the reports of the last `window`
// (plus the one just before it, as the base).
class RateWindow {
 public:
  explicit RateWindow(Duration window) : window_(window) {}
  void Add(TimePoint t, double steps, double samples) {
    points_.push_back({t, steps, samples});
    std::size_t drop = 0;
    while (points_.size() - drop > 2 && points_[drop + 1].t <= t - window_) ++drop;
    points_.erase(points_.begin(), points_.begin() + static_cast<std::ptrdiff_t>(drop));
  }
  void Clear() { points_.clear(); }
  // Per second over the window ending now; 0 without two points, or when
  // the latest report is older than two windows (the rank went silent).
  double StepsPerSecond(TimePoint now) const { return Rate(now, false); }
  // -1 when the samples are unknown (< 0).
  double SamplesPerSecond(TimePoint now) const {
    if (points_.empty() || points_.back().samples < 0 || points_.front().samples < 0) return -1;
    return Rate(now, true);
  }

 private:
  struct Point {
    TimePoint t;
    double steps, samples;
  };
  double Rate(TimePoint now, bool samples) const {
    if (points_.size() < 2 || now - points_.back().t > 2 * window_) return 0;
    const Point& a = points_.front();
    const Point& b = points_.back();
    const double dt = std::chrono::duration<double>(b.t - a.t).count();
    if (dt < 0.2) return 0;
    const double d = samples ? b.samples - a.samples : b.steps - a.steps;
    return d > 0 ? d / dt : 0;
  }
  Duration window_;
  std::vector<Point> points_;  // a few (one a report); empty allocates nothing
};

}  // namespace ddprun::rendezvous
