// The one place absl::Status becomes ddp::Error (see ddp/error.h).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/error.h"

namespace ddp::detail {

// The payload that marks a Status as "a peer of the group is gone" (an
// Unavailable status): its value is the lost job rank, or "-1" when unknown.
inline constexpr const char* kPeerLostPayload = "ddp.peer_lost";
// An Unavailable status carrying kPeerLostPayload = lost_rank.
absl::Status PeerLostStatus(const std::string& message, int lost_rank);
// The lost rank of a PeerLostStatus (-1: unknown), nullopt for any other status.
std::optional<int> LostRankOf(const absl::Status& status);
// `status` with its message replaced, keeping its code and payloads.
absl::Status WithMessage(const absl::Status& status, const std::string& message);

ErrorCode CodeOf(const absl::Status& status);
// Throws the ddp::Error subclass for status; no-op when ok.
void ThrowIfError(const absl::Status& status);

template <class T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return std::move(v).value();
}

}  // namespace ddp::detail
