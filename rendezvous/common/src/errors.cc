#include "ddprun/rendezvous/common/errors.h"

#include "absl/strings/cord.h"

namespace ddprun::rendezvous {

absl::Status ClosedError(absl::string_view message) {
  absl::Status st = absl::FailedPreconditionError(message);
  st.SetPayload(kKindPayload, absl::Cord("closed"));
  return st;
}

absl::Status UsageMistake(absl::string_view message) {
  absl::Status st = absl::InvalidArgumentError(message);
  st.SetPayload(kKindPayload, absl::Cord("usage"));
  return st;
}

bool IsUsageMistake(const absl::Status& status) {
  if (!absl::IsInvalidArgument(status)) return false;
  const auto kind = status.GetPayload(kKindPayload);
  return kind && *kind == "usage";
}

ErrorKind KindOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return ErrorKind::kOk;
    case absl::StatusCode::kDeadlineExceeded: return ErrorKind::kTimeout;
    case absl::StatusCode::kUnavailable: return ErrorKind::kConnection;
    case absl::StatusCode::kFailedPrecondition: {
      auto kind = status.GetPayload(kKindPayload);
      return kind && *kind == "closed" ? ErrorKind::kClosed : ErrorKind::kState;
    }
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated: return ErrorKind::kAuth;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange: return ErrorKind::kBadInput;
    default: return ErrorKind::kInternal;
  }
}

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk: return "ok";
    case ErrorKind::kClosed: return "closed";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kConnection: return "connection";
    case ErrorKind::kState: return "state";
    case ErrorKind::kAuth: return "auth";
    case ErrorKind::kBadInput: return "bad input";
    case ErrorKind::kInternal: return "internal";
  }
  return "internal";
}

}  // namespace ddprun::rendezvous
