#include "ddprun/rendezvous/common/wait_notice.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {

std::string FormatWaitLine(const WaitState& state, TimePoint now) {
  const Duration left = std::max<Duration>(state.until - now, Duration::zero());
  const long secs = std::lround(std::chrono::duration<double>(left).count());
  std::string line = state.what;
  if (!state.progress.empty()) absl::StrAppend(&line, ": ", state.progress);
  absl::StrAppend(&line, "; until ", WallClockAfter(left), " (in ", secs, " s)");
  if (!state.then.empty()) absl::StrAppend(&line, ", then ", state.then);
  return line;
}

WaitNotice::WaitNotice(const Clock& clock, std::function<WaitState()> describe,
                       std::function<void(const std::string&)> emit)
    : clock_(clock),
      describe_(std::move(describe)),
      emit_(std::move(emit)),
      due_(clock.Now() + kWaitNoticeFirst) {}

bool WaitNotice::Poll() {
  const TimePoint now = clock_.Now();
  if (now < due_) return false;
  emit_(FormatWaitLine(describe_(), now));
  ++lines_;
  due_ = now + kWaitNoticeEvery;
  return true;
}

}  // namespace ddprun::rendezvous
