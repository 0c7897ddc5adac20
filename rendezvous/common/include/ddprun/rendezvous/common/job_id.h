// The one rule for job ids (--rdzv_id, job.id in a job file, the daemon's
// requests, DDPRUN_JOB_ID): 1 to 256 bytes of ASCII letters, digits and
// '-', '_', '.', ':', '@', '+', not starting with '-' or '.'. A job id names
// log directories (<log_dir>/<id>/...) and appears in every message's fence,
// so it cannot hold a space, a '/' or a control character. docs/cli.md states
// the same rule.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ddprun::rendezvous {

inline constexpr std::size_t kMaxJobIdBytes = 256;

// InvalidArgument naming what is wrong and the rule; the caller names where
// the id came from.
absl::Status ValidateJobId(std::string_view id);

// A fresh random id (a version-4 UUID) for jobs that give none.
std::string RandomJobId();

}  // namespace ddprun::rendezvous
