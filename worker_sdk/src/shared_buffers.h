// Shareable host memory: buffers that the other ranks of this host can map,
// so that a shared-memory all-reduce reads and writes them in place instead
// of staging them through the group's segment (shm_group.h, "direct path").
//
// Each buffer is its own memfd, mapped MAP_SHARED in this process and kept
// open until it is freed; a peer maps it through /proc/<pid>/fd/<fd>, as it
// maps the group's segment. The registry is process-wide (any group may
// reduce a buffer; freeing it does not need the group that used it) and
// thread-safe. Buffers are zero-filled and their pages are populated at
// allocation (first-touch faults are slow on VMs).
//
// Where this memory comes from in the API: ProcessGroup::AllocMemory on a
// CPU group whose ranks share a host, and the Reducer's buckets there
// (Backend::Alloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"

namespace ddp::detail {

// Where a byte range lies in a shareable buffer, as a peer needs to find it.
struct SharedRef {
  std::uint64_t serial = 0;        // unique per buffer in this process (never 0)
  std::int32_t fd = -1;            // the buffer's memfd in this process
  std::uint64_t buffer_bytes = 0;  // the memfd's size
  std::uint64_t offset = 0;        // the range's first byte in the buffer
};

// A new shareable buffer of `bytes` (at least one page), page-aligned.
// ResourceExhausted when the memory cannot be had.
absl::StatusOr<void*> AllocShared(std::size_t bytes);

// Frees a buffer AllocShared returned; false (nothing done) when `p` is not
// the start of one.
bool FreeShared(void* p);

// The buffer holding all of [p, p + bytes), if any.
std::optional<SharedRef> FindShared(const void* p, std::size_t bytes);

}  // namespace ddp::detail
