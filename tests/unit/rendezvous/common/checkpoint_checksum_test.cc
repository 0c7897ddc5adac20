// CRC-32C of checkpoint snapshots (checkpoint_checksum.h): the published
// check value, agreement of the lanes, threads and continuations with a
// bit-at-a-time reference at every split, and the copy.
#include "ddprun/rendezvous/common/checkpoint_checksum.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace cs = ddprun::checkpoint_checksum;

namespace {

// Bit-at-a-time CRC-32C: the definition, independent of the code under test.
std::uint32_t Reference(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

std::vector<unsigned char> Random(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

}  // namespace

TEST_CASE("CRC-32C: the check value of \"123456789\" is e3069283", "[unit][checkpoint]") {
  const char* text = "123456789";
  CHECK(cs::Crc32c(0, text, 9) == 0xE3069283u);
  CHECK(cs::Crc32c(0, text, 0) == 0u);
}

TEST_CASE("CRC-32C: every length and continuation equals the bit-at-a-time reference",
          "[unit][checkpoint]") {
  // Lengths across the three-lane threshold (3 * 4096 bytes) and odd tails.
  const auto data = Random(40000, 1);
  for (std::size_t n : {1u, 7u, 8u, 9u, 63u, 4095u, 12287u, 12288u, 12295u, 24577u, 40000u}) {
    INFO("n=" << n);
    const std::uint32_t want = Reference(data.data(), n);
    CHECK(cs::Crc32c(0, data.data(), n) == want);
    for (std::size_t cut : {std::size_t{0}, n / 3, n - 1}) {
      const std::uint32_t first = cs::Crc32c(0, data.data(), cut);
      CHECK(cs::Crc32c(first, data.data() + cut, n - cut) == want);
      CHECK(cs::Crc32cCombine(first, cs::Crc32c(0, data.data() + cut, n - cut), n - cut) == want);
    }
  }
}

TEST_CASE("CRC-32C: CopyCrc32c copies and checksums alike with 1 to 4 threads",
          "[unit][checkpoint]") {
  // 64 MiB + 12345 bytes: up to four parts of 16 MiB (the last with the tail).
  const std::size_t n = (64u << 20) + 12345;
  const auto src = Random(n, 2);
  const std::uint32_t want = cs::Crc32c(cs::Crc32c(0, "ab", 2), src.data(), n);
  CHECK(want == [&] {
    std::vector<unsigned char> all = {'a', 'b'};
    all.insert(all.end(), src.begin(), src.end());
    return Reference(all.data(), all.size());
  }());
  for (int threads : {1, 2, 3, 4}) {
    INFO("threads=" << threads);
    std::vector<unsigned char> dst(n, 0);
    CHECK(cs::CopyCrc32c(cs::Crc32c(0, "ab", 2), dst.data(), src.data(), n, threads) == want);
    CHECK(std::memcmp(dst.data(), src.data(), n) == 0);
    // A null destination only checksums, in the same parts (load's check
    // of the tensors it maps).
    CHECK(cs::CopyCrc32c(cs::Crc32c(0, "ab", 2), nullptr, src.data(), n, threads) == want);
  }
  CHECK(cs::CopyCrc32c(7, nullptr, nullptr, 0, 4) == 7u);
}
