// The worker SDK's error convention: one small exception hierarchy, thrown
// only at the public boundary. Inside, the SDK returns absl::Status (the
// rendezvous layer's convention) and converts it once, in src/status.cc:
//
//   DeadlineExceeded                 -> TimeoutError
//   Unavailable + kPeerLostPayload   -> PeerLostError (a ConnectionError)
//   Unavailable, Aborted             -> ConnectionError
//   PermissionDenied, Unauthenticated-> AuthError
//   InvalidArgument, OutOfRange, ... -> InvalidArgumentError
//   FailedPrecondition               -> StateError (wrong order, aborted group)
//   anything else                    -> Error
//
// Messages start with the job fence "[job <id> round <n> rank <r>]" when the
// SDK knows it, then name the operation and, where known, the peer.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Stable codes, shared with the C API (ddp_status_t in c_api.h).
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad input: null pointer, wrong dtype, size mismatch, bad env
  kTimeout = 2,          // a collective or a store wait exceeded its timeout
  kConnection = 3,       // a peer died or the store is unreachable
  kAuth = 4,             // the store refused our job id or token
  kState = 5,            // wrong call order, or a communicator that was aborted
  kUnsupported = 6,      // not available in this build or on this backend
  kInternal = 7,
  // A collective could not complete because a peer process of the group is
  // gone (it died, or the agent reports the group broken). The group is
  // aborted; under --restart_policy=inplace, ddp::Reconfigure gives the new
  // round's group in this process.
  kPeerLost = 8,
};

const char* ErrorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& m) : Error(ErrorCode::kInvalidArgument, m) {}
};
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& m) : Error(ErrorCode::kTimeout, m) {}
};
class ConnectionError : public Error {
 public:
  explicit ConnectionError(const std::string& m) : Error(ErrorCode::kConnection, m) {}

 protected:
  ConnectionError(ErrorCode code, const std::string& m) : Error(code, m) {}
};
// A peer of the group is gone: the collective failed at once (no timeout
// wait). rank() is the job rank that was lost, or -1 when the SDK only knows
// that the group is broken (the agent said so). Catching ConnectionError
// catches it too.
class PeerLostError : public ConnectionError {
 public:
  PeerLostError(const std::string& m, int rank)
      : ConnectionError(ErrorCode::kPeerLost, m), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};
class AuthError : public Error {
 public:
  explicit AuthError(const std::string& m) : Error(ErrorCode::kAuth, m) {}
};
class StateError : public Error {
 public:
  explicit StateError(const std::string& m) : Error(ErrorCode::kState, m) {}
};
class UnsupportedError : public Error {
 public:
  explicit UnsupportedError(const std::string& m) : Error(ErrorCode::kUnsupported, m) {}
};

}  // namespace ddp
