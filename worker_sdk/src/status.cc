#include "status.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "ddp/types.h"

namespace ddp {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kConnection: return "connection";
    case ErrorCode::kAuth: return "auth";
    case ErrorCode::kState: return "state";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kPeerLost: return "peer lost";
  }
  return "unknown";
}

std::size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "f64";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
  }
  return "invalid-dtype";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "invalid-op";
}

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "invalid-backend";
}

bool IsValidDType(int dtype) { return dtype >= 0 && dtype <= 5; }
bool IsValidReduceOp(int op) { return op >= 0 && op <= 3; }

namespace detail {

absl::Status PeerLostStatus(const std::string& message, int lost_rank) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kPeerLostPayload, absl::Cord(std::to_string(lost_rank)));
  return s;
}

std::optional<int> LostRankOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return std::nullopt;
  auto p = status.GetPayload(kPeerLostPayload);
  if (!p) return std::nullopt;
  int rank = -1;
  if (!absl::SimpleAtoi(std::string(*p), &rank)) rank = -1;
  return rank;
}

absl::Status WithMessage(const absl::Status& status, const std::string& message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view key, const absl::Cord& value) { out.SetPayload(key, value); });
  return out;
}

ErrorCode CodeOf(const absl::Status& status) {
  if (LostRankOf(status)) return ErrorCode::kPeerLost;
  switch (status.code()) {
    case absl::StatusCode::kOk: return ErrorCode::kOk;
    case absl::StatusCode::kDeadlineExceeded: return ErrorCode::kTimeout;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled: return ErrorCode::kConnection;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated: return ErrorCode::kAuth;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kResourceExhausted: return ErrorCode::kInvalidArgument;
    case absl::StatusCode::kFailedPrecondition: return ErrorCode::kState;
    case absl::StatusCode::kUnimplemented: return ErrorCode::kUnsupported;
    default: return ErrorCode::kInternal;
  }
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string msg(status.message());
  switch (CodeOf(status)) {
    case ErrorCode::kOk: return;
    case ErrorCode::kInvalidArgument: throw InvalidArgumentError(msg);
    case ErrorCode::kTimeout: throw TimeoutError(msg);
    case ErrorCode::kConnection: throw ConnectionError(msg);
    case ErrorCode::kAuth: throw AuthError(msg);
    case ErrorCode::kState: throw StateError(msg);
    case ErrorCode::kUnsupported: throw UnsupportedError(msg);
    case ErrorCode::kInternal: throw Error(ErrorCode::kInternal, msg);
    case ErrorCode::kPeerLost: throw PeerLostError(msg, *LostRankOf(status));
  }
}

}  // namespace detail
}  // namespace ddp
