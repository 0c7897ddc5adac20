// How a job snapshot too large for one etcd request is kept in etcd: the
// serialized JobSnapshot compressed with zlib and cut into chunks of at most
// chunk_bytes, plus a small head that names the version, the chunk count, the
// sizes and the compressed bytes' CRC-32. Pure functions: no etcd, no I/O
// (etcd_journal.cc writes and reads the keys; docs/ha.md has the layout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

// The value of P/jobs/<hex>/head.
struct SnapshotHead {
  std::int64_t version = 0;  // the chunks live under snapshot/<version, 20 digits>/
  std::int64_t chunks = 0;   // chunk keys 0..chunks-1
  std::uint64_t compressed_bytes = 0;
  std::uint64_t raw_bytes = 0;  // the serialized JobSnapshot
  std::uint32_t crc32 = 0;      // of the compressed bytes
};

std::string EncodeSnapshotHead(const SnapshotHead& head);
// InvalidArgument naming what is wrong when the text is not a head.
absl::StatusOr<SnapshotHead> ParseSnapshotHead(const std::string& text);

// raw compressed and cut into chunks of at most chunk_bytes (>= 1); fills
// head except its version.
std::vector<std::string> CompressAndSplit(const std::string& raw, std::size_t chunk_bytes,
                                          SnapshotHead* head);

// The inverse: chunks[i] is chunk i of head. InvalidArgument when a size, the
// CRC or the compressed stream does not match (a torn or foreign write).
absl::StatusOr<std::string> JoinAndDecompress(const SnapshotHead& head,
                                              const std::vector<std::string>& chunks);

}  // namespace ddprun::rendezvous
