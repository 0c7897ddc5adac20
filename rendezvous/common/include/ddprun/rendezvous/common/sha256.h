// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained: bin/ddprun
// links no libcrypto (its static tables cost ~18,000 start-up relocations of
// the PIE at every launch; docs/launch.md). `ddprun check` compares the
// training script's digest across nodes with it; the agents' replica
// handshake proves the job's secret with HMAC-SHA256 (checkpoint_replica_wire.h).
// The compression function has no data-dependent branches or table lookups;
// compare MACs with DigestsEqual, which takes the same time for any input.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::rendezvous {

using Sha256Digest = std::array<std::uint8_t, 32>;

// Incremental digest: Update any number of times, then Digest or HexDigest
// once.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, std::size_t size);
  // The 32 bytes of the digest; the object is spent afterwards.
  Sha256Digest Digest();
  // The 64 lowercase hex digits; the object is spent afterwards.
  std::string HexDigest();

 private:
  void Block(const unsigned char* p);
  std::array<std::uint32_t, 8> h_;
  unsigned char buf_[64];
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// One-shot digest of `data` in hex.
std::string Sha256Hex(std::string_view data);

// HMAC-SHA256 of `message` under `key` (any length; RFC 4231's vectors).
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

// Whether a and b are equal, in a time that does not depend on where they
// differ (for MACs).
bool DigestsEqual(std::string_view a, std::string_view b);

}  // namespace ddprun::rendezvous
