// The one place absl::Status becomes ddp::Error (see ddp/error.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/error.h"

namespace ddp::detail {

ErrorCode CodeOf(const absl::Status& status);
// Throws the ddp::Error subclass for status; no-op when ok.
void ThrowIfError(const absl::Status& status);

template <class T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return std::move(v).value();
}

}  // namespace ddp::detail
