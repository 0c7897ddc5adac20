// SHA-256 (FIPS 180-4), self-contained: `ddprun check` compares the training
// script's digest across nodes, and bin/ddprun links no libcrypto for it
// (its static tables cost ~18,000 start-up relocations of the PIE at every
// launch; docs/launch.md). Not for secrets: no constant-time claims needed.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::launcher {

// Incremental digest: Update any number of times, then HexDigest once.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, std::size_t size);
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

}  // namespace ddprun::launcher
