// The states the monitoring views carry (metrics_hub.h): a job's, a rank's
// and its hang detection's. Values everywhere; their text exists only for
// the renderers (metrics_json.cc, prometheus_text.cc), through Name(), and
// is part of their formats: /api/v1/jobs, the dashboard, `ddprun top` and
// /metrics read it, so a name never changes.
#pragma once

#include <optional>
#include <string_view>

namespace ddprun::rendezvous {

// A job as the hub sees it: its round running, between rounds, or closed.
enum class JobState {
  kGathering,  // "gathering": no round running (before the first, or after a restart)
  kRunning,    // "running"
  kSucceeded,  // "succeeded"
  kFailed,     // "failed"
};

// A worker as its agent last reported it.
enum class RankState {
  kUnknown,  // "unknown": not heard from yet, or an unknown state was reported
  kRunning,  // "running"
  kExited,   // "exited"
  kFailed,   // "failed"
  kStopped,  // "stopped"
};

// What hang detection does for a job (docs/monitoring.md).
enum class HangState {
  kOff,               // "off": no --hang_timeout, or the job closed
  kNoProgressSource,  // "no progress source": nothing counts progress
  kArmed,             // "armed"
  kCapturing,         // "capturing": asking the culprits for their stacks
  kReported,          // "reported": a report was published
};

const char* Name(JobState state);
const char* Name(RankState state);
const char* Name(HangState state);

// A worker state as agents send it (RankSample::state: "running", "exited",
// "failed", "stopped"); nullopt for anything else.
std::optional<RankState> ParseRankState(std::string_view text);

}  // namespace ddprun::rendezvous
