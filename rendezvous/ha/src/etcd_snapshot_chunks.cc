#include "ddprun/rendezvous/ha/etcd_snapshot_chunks.h"

#include <zlib.h>

#include <cinttypes>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {
namespace {

constexpr const char* kHeadTag = "ddprun-snapshot-head-1";
// Fast: a snapshot is written at every round change, read only at a fail-over.
constexpr int kLevel = 1;

}  // namespace

std::string EncodeSnapshotHead(const SnapshotHead& h) {
  return absl::StrCat(kHeadTag, " version=", h.version, " chunks=", h.chunks,
                      " compressed=", h.compressed_bytes, " raw=", h.raw_bytes, " crc32=", h.crc32);
}

absl::StatusOr<SnapshotHead> ParseSnapshotHead(const std::string& text) {
  SnapshotHead h;
  char tag[32] = {};
  unsigned long crc = 0;
  int used = 0;
  const int n =
      std::sscanf(text.c_str(),
                  "%31s version=%" SCNd64 " chunks=%" SCNd64 " compressed=%" SCNu64 " raw=%" SCNu64
                  " crc32=%lu%n",
                  tag, &h.version, &h.chunks, &h.compressed_bytes, &h.raw_bytes, &crc, &used);
  if (n != 6 || std::string(tag) != kHeadTag || static_cast<std::size_t>(used) != text.size() ||
      h.version < 1 || h.chunks < 1 || h.compressed_bytes < 1 || crc > 0xffffffffUL) {
    return absl::InvalidArgumentError("not a ddprun snapshot head");
  }
  h.crc32 = static_cast<std::uint32_t>(crc);
  return h;
}

std::vector<std::string> CompressAndSplit(const std::string& raw, std::size_t chunk_bytes,
                                          SnapshotHead* head) {
  uLongf size = compressBound(raw.size());
  std::string z(size, '\0');
  // compress2 fails only on a too-small buffer or memory; compressBound rules out the first.
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &size,
                reinterpret_cast<const Bytef*>(raw.data()), raw.size(), kLevel) != Z_OK) {
    throw std::bad_alloc();
  }
  z.resize(size);
  head->raw_bytes = raw.size();
  head->compressed_bytes = z.size();
  head->crc32 = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(z.data()), static_cast<uInt>(z.size())));
  std::vector<std::string> chunks;
  for (std::size_t at = 0; at < z.size(); at += chunk_bytes) {
    chunks.push_back(z.substr(at, chunk_bytes));
  }
  head->chunks = static_cast<std::int64_t>(chunks.size());
  return chunks;
}

absl::StatusOr<std::string> JoinAndDecompress(const SnapshotHead& head,
                                              const std::vector<std::string>& chunks) {
  if (static_cast<std::int64_t>(chunks.size()) != head.chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat(chunks.size(), " chunks where the head names ", head.chunks));
  }
  std::string z;
  z.reserve(head.compressed_bytes);
  for (const std::string& c : chunks) z += c;
  if (z.size() != head.compressed_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(z.size(), " compressed bytes where the head names ", head.compressed_bytes));
  }
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(z.data()), static_cast<uInt>(z.size())));
  if (crc != head.crc32) return absl::InvalidArgumentError("the chunks' CRC-32 does not match");
  // zlib expands at most ~1032:1; a larger raw size is a damaged head, not an allocation to try.
  if (head.raw_bytes > head.compressed_bytes * 1100 + 64) {
    return absl::InvalidArgumentError("the head's raw size is impossible for its compressed size");
  }
  std::string raw(head.raw_bytes, '\0');
  uLongf size = raw.size();
  if (uncompress(reinterpret_cast<Bytef*>(raw.data()), &size,
                 reinterpret_cast<const Bytef*>(z.data()), z.size()) != Z_OK ||
      size != raw.size()) {
    return absl::InvalidArgumentError("the chunks do not decompress to the head's size");
  }
  return raw;
}

}  // namespace ddprun::rendezvous
