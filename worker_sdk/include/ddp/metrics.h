// Live metrics for ddprun's monitoring (docs/sdk.md, docs/monitoring-sources.md).
//
//   for (auto& batch : loader) {
//     ... forward, backward, optimizer step ...
//     ddp::metrics::Step(batch.size());          // one step, its samples
//     ddp::metrics::Scalar("loss", loss);        // any named value
//   }
//
// Under ddprun each call is a few stores into a shared page that the agent
// reads once a second (no system call, no lock shared with another
// process); a step's duration is the time since the previous Step(). Not
// under ddprun (no DDPRUN_METRICS_FILE), or when the channel cannot be
// opened (one line on stderr), every call is one branch. Thread-safe.
// The SDK's collectives are recorded by the SDK itself (CPU groups).
#pragma once

#include <string_view>

namespace ddp::metrics {

// One training step done, with `samples` samples (< 0: unknown).
void Step(double samples = -1);
// Sets the named scalar (loss, lr, tokens, ...). Names are 1-119 bytes of
// printable ASCII without spaces; at most 256 names per worker. A refused
// name returns false and is counted as dropped.
bool Scalar(std::string_view name, double value);
// Whether this process reports to a ddprun agent.
bool Enabled();

}  // namespace ddp::metrics
