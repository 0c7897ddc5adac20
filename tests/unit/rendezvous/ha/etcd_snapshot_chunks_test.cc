// A job snapshot compressed and cut into chunks for etcd, and put back
// together: round trips at every chunk size, and each way a torn or foreign
// write is told apart (rendezvous/ha/include/ddprun/rendezvous/ha/etcd_snapshot_chunks.h).
#include "ddprun/rendezvous/ha/etcd_snapshot_chunks.h"

#include <catch2/catch.hpp>
#include <random>

#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

// Member-like text (compressible) with random bytes mixed in (so that it is
// not all compressible), about `bytes` long.
std::string SnapshotLike(std::size_t bytes) {
  std::mt19937 rng(7);
  std::string out;
  for (int i = 0; out.size() < bytes; ++i) {
    out += "node-" + std::to_string(i) + " 10.1." + std::to_string(i % 250) + ".7 pid " +
           std::to_string(rng() % 100000) + " train.py;";
    out.push_back(static_cast<char>(rng()));
  }
  return out;
}

TEST_CASE("snapshot chunks: compress, split and join back at several chunk sizes", "[unit]") {
  const std::string raw = SnapshotLike(300000);
  for (std::size_t chunk :
       {std::size_t{1}, std::size_t{1000}, std::size_t{65536}, std::size_t{10} << 20}) {
    SnapshotHead head;
    const std::vector<std::string> chunks = CompressAndSplit(raw, chunk, &head);
    head.version = 3;
    CHECK(head.raw_bytes == raw.size());
    CHECK(head.compressed_bytes < raw.size());
    CHECK(head.chunks == static_cast<std::int64_t>(chunks.size()));
    CHECK(head.chunks == static_cast<std::int64_t>((head.compressed_bytes + chunk - 1) / chunk));
    for (const auto& c : chunks) CHECK(c.size() <= chunk);
    absl::StatusOr<SnapshotHead> parsed = ParseSnapshotHead(EncodeSnapshotHead(head));
    REQUIRE(parsed.ok());
    CHECK(parsed->version == 3);
    CHECK(parsed->crc32 == head.crc32);
    absl::StatusOr<std::string> back = JoinAndDecompress(*parsed, chunks);
    REQUIRE(back.ok());
    CHECK(*back == raw);
  }
}

TEST_CASE("snapshot chunks: a missing, damaged or foreign chunk is refused, never misread",
          "[unit]") {
  const std::string raw = SnapshotLike(50000);
  SnapshotHead head;
  std::vector<std::string> chunks = CompressAndSplit(raw, 4096, &head);
  head.version = 1;
  REQUIRE(chunks.size() > 2);
  auto refused = [&](const std::vector<std::string>& c) {
    absl::StatusOr<std::string> r = JoinAndDecompress(head, c);
    return !r.ok() && KindOf(r.status()) == ErrorKind::kBadInput;
  };
  std::vector<std::string> fewer(chunks.begin(), chunks.end() - 1);
  CHECK(refused(fewer));
  std::vector<std::string> flipped = chunks;
  flipped[1][7] ^= 1;
  CHECK(refused(flipped));
  std::vector<std::string> shorter = chunks;
  shorter.back().pop_back();
  CHECK(refused(shorter));
  // A head claiming an impossible raw size is refused before any allocation.
  SnapshotHead huge = head;
  huge.raw_bytes = std::uint64_t{1} << 50;
  CHECK(KindOf(JoinAndDecompress(huge, chunks).status()) == ErrorKind::kBadInput);
  // Another version's chunks (another snapshot) under this head.
  SnapshotHead other;
  std::vector<std::string> foreign = CompressAndSplit(SnapshotLike(50001), 4096, &other);
  foreign.resize(chunks.size());
  CHECK(refused(foreign));
}

TEST_CASE("snapshot chunks: a head's text is checked field by field", "[unit]") {
  SnapshotHead h{.version = 2, .chunks = 3, .compressed_bytes = 10, .raw_bytes = 40, .crc32 = 9};
  CHECK(ParseSnapshotHead(EncodeSnapshotHead(h)).ok());
  for (const char* bad :
       {"", "ddprun-snapshot-head-1", "x version=1 chunks=1 compressed=1 raw=1 crc32=1",
        "ddprun-snapshot-head-1 version=0 chunks=1 compressed=1 raw=1 crc32=1",
        "ddprun-snapshot-head-1 version=1 chunks=0 compressed=1 raw=1 crc32=1",
        "ddprun-snapshot-head-1 version=1 chunks=1 compressed=1 raw=1 crc32=1 x",
        "ddprun-snapshot-head-1 version=1 chunks=1 compressed=1 raw=1 "
        "crc32=99999999999"}) {
    CAPTURE(bad);
    CHECK(KindOf(ParseSnapshotHead(bad).status()) == ErrorKind::kBadInput);
  }
}

}  // namespace
}  // namespace ddprun::rendezvous
