// The one error-propagation toolkit of every layer (absl::Status inside;
// the edges map it once: gRPC in proto_convert.cc, exit codes and one-line
// messages in the launcher, ddp::Error in worker_sdk/src/status.cc).
//
//   DDPRUN_RETURN_IF_ERROR(expr);            // expr yields absl::Status or StatusOr<T>
//   DDPRUN_ASSIGN_OR_RETURN(auto v, expr);   // expr yields absl::StatusOr<T>
//   DDPRUN_CHECK(cond) << "context";         // an invariant: aborts with file:line
//
// DDPRUN_CHECK is for broken invariants of our own code, never for input:
// bad input is an InvalidArgument status.
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddprun::internal {

inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <class T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Streams a message, then aborts when destroyed (at the end of the statement).
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    out_ << file << ":" << line << ": invariant broken: " << cond;
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << out_.str() << std::endl;
    std::abort();
  }
  template <class T>
  CheckFailure& operator<<(const T& v) {
    out_ << (first_ ? ": " : "") << v;
    first_ = false;
    return *this;
  }

 private:
  std::ostringstream out_;
  bool first_ = true;
};

// Makes `cond ? (void)0 : Voidify() & CheckFailure(...) << ...` well-typed.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace ddprun::internal

#define DDPRUN_RETURN_IF_ERROR(expr)                                           \
  do {                                                                         \
    if (const auto& _ddprun_st = (expr); !_ddprun_st.ok())                     \
      return ::absl::Status(::ddprun::internal::AsStatus(_ddprun_st));         \
  } while (0)

#define DDPRUN_STATUS_CONCAT_INNER_(a, b) a##b
#define DDPRUN_STATUS_CONCAT_(a, b) DDPRUN_STATUS_CONCAT_INNER_(a, b)

#define DDPRUN_ASSIGN_OR_RETURN(lhs, expr) \
  DDPRUN_ASSIGN_OR_RETURN_IMPL_(DDPRUN_STATUS_CONCAT_(_ddprun_or_, __LINE__), lhs, expr)
#define DDPRUN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return ::absl::Status(tmp.status()); \
  lhs = std::move(tmp).value()

#define DDPRUN_CHECK(cond)           \
  (cond) ? (void)0                   \
         : ::ddprun::internal::Voidify() & ::ddprun::internal::CheckFailure(__FILE__, __LINE__, #cond)
