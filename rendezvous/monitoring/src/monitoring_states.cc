#include "ddprun/rendezvous/monitoring/monitoring_states.h"

namespace ddprun::rendezvous {

const char* Name(JobState state) {
  switch (state) {
    case JobState::kGathering:
      return "gathering";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
  }
  return "gathering";
}

const char* Name(RankState state) {
  switch (state) {
    case RankState::kUnknown:
      return "unknown";
    case RankState::kRunning:
      return "running";
    case RankState::kExited:
      return "exited";
    case RankState::kFailed:
      return "failed";
    case RankState::kStopped:
      return "stopped";
  }
  return "unknown";
}

const char* Name(HangState state) {
  switch (state) {
    case HangState::kOff:
      return "off";
    case HangState::kNoProgressSource:
      return "no progress source";
    case HangState::kArmed:
      return "armed";
    case HangState::kCapturing:
      return "capturing";
    case HangState::kReported:
      return "reported";
  }
  return "off";
}

std::optional<RankState> ParseRankState(std::string_view text) {
  for (RankState s :
       {RankState::kRunning, RankState::kExited, RankState::kFailed, RankState::kStopped}) {
    if (text == Name(s)) return s;
  }
  return std::nullopt;
}

}  // namespace ddprun::rendezvous
