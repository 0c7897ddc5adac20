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
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::rendezvous {

// The kinds that callers decide on. Decide on KindOf(status), never on a
// message's text.
enum class ErrorKind {
  kOk,
  kClosed,      // the job ended (FailedPrecondition carrying kKindPayload = "closed")
  kTimeout,     // DeadlineExceeded
  kConnection,  // Unavailable
  kState,       // FailedPrecondition: a stale round, a mismatched node
  kAuth,        // PermissionDenied, Unauthenticated
  kBadInput,    // InvalidArgument, AlreadyExists, ResourceExhausted, OutOfRange
  kInternal,    // anything else
};

// The status payload that tells Closed from State (both FailedPrecondition);
// proto_convert.cc carries it across gRPC.
inline constexpr const char* kKindPayload = "ddprun.kind";

absl::Status ClosedError(absl::string_view message);
ErrorKind KindOf(const absl::Status& status);
// A mistake in what the user gave this process (a flag, a file) that only
// shows once it runs, e.g. a node that must host the rendezvous over TLS
// without --tls_cert: InvalidArgument (kind kBadInput) marked with
// kKindPayload = "usage", so that the launcher exits 2 (usage) for it and 3
// for the rendezvous' own bad-input verdicts. Local only: not carried by
// proto_convert.
absl::Status UsageMistake(absl::string_view message);
bool IsUsageMistake(const absl::Status& status);
const char* ErrorKindName(ErrorKind kind);  // "closed", "timeout", ...

// Prefix for every message about a job: "[job job42 round 3] ".
inline std::string Fence(std::string_view job_id, long long round) {
  return "[job " + std::string(job_id) + " round " + std::to_string(round) + "] ";
}

// A worker's messages also name its rank: "[job job42 round 3 rank 5] ".
inline std::string Fence(std::string_view job_id, long long round, int rank) {
  return "[job " + std::string(job_id) + " round " + std::to_string(round) + " rank " +
         std::to_string(rank) + "] ";
}

}  // namespace ddprun::rendezvous
