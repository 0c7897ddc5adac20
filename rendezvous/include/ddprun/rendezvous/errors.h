// The rendezvous layer's error convention: absl::Status, with error kinds
// named after torchelastic's taxonomy. They are mapped to gRPC codes once, in
// grpc_status.h, and to exit codes and one-line messages in the launcher.
//
//   Closed     -> kFailedPrecondition with "closed" (the job ended)
//   Timeout    -> kDeadlineExceeded
//   Connection -> kUnavailable
//   State      -> kFailedPrecondition (a stale round, a mismatched node)
//   Auth       -> kPermissionDenied (wrong job or token)
//   Bad input  -> kInvalidArgument, kAlreadyExists, kResourceExhausted
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

// Evaluates an expression that yields absl::Status and returns it on error.
#define DDPRUN_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::absl::Status _st = (expr);                \
    if (!_st.ok()) return _st;                  \
  } while (0)

// Prefix for every message about a job: "[job job42 round 3] ".
inline std::string Fence(std::string_view job_id, long long round) {
  return "[job " + std::string(job_id) + " round " + std::to_string(round) + "] ";
}

}  // namespace ddprun::rendezvous
