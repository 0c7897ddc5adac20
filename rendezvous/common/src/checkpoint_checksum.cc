// CRC-32C for checkpoint snapshots (checkpoint_checksum.h). The arithmetic
// is on the raw CRC register (without the initial and final XOR), where
// the CRC is linear: raw(r, a || b) = shift(raw(r, a), |b|) ^ raw(0, b),
// shift(r, k) being r times x^(8k) modulo the polynomial (zlib's
// crc32_combine, with the Castagnoli polynomial). That lets three lanes of
// one thread and the parts of several threads run independently.
#include "ddprun/rendezvous/common/checkpoint_checksum.h"

#include <sched.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/common/checkpoint_layout.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ddprun::checkpoint_checksum {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli

// a * b modulo the polynomial (reflected: bit 31 is x^0).
std::uint32_t MultModP(std::uint32_t a, std::uint32_t b) {
  std::uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0..31.
const std::array<std::uint32_t, 32>& X2nTable() {
  static const std::array<std::uint32_t, 32> table = [] {
    std::array<std::uint32_t, 32> t{};
    std::uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (int k = 1; k < 32; ++k) t[k] = p = MultModP(p, p);
    return t;
  }();
  return table;
}

// The raw register r moved over `bytes` zero bytes: r * x^(8 * bytes).
std::uint32_t Shift(std::uint32_t r, std::size_t bytes) {
  const auto& table = X2nTable();
  std::uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;              // 8 bits per byte: x^(2^3) per byte
  for (std::size_t n = bytes; n; n >>= 1, ++k) {
    if (n & 1) p = MultModP(table[k & 31], p);
  }
  return MultModP(p, r);
}

const std::array<std::uint32_t, 256>& ByteTable() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int j = 0; j < 8; ++j) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// The raw register over n bytes by table, copying them to dst when not null.
std::uint32_t RawSoftware(std::uint32_t r, unsigned char* dst, const unsigned char* src,
                          std::size_t n) {
  const auto& table = ByteTable();
  if (dst != nullptr) std::memcpy(dst, src, n);
  for (std::size_t i = 0; i < n; ++i) r = table[(r ^ src[i]) & 0xFF] ^ (r >> 8);
  return r;
}

#if defined(__x86_64__)
bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}

__attribute__((target("sse4.2"))) std::uint32_t RawHardwareLane(std::uint32_t r, unsigned char* dst,
                                                                const unsigned char* src,
                                                                std::size_t n) {
  std::uint64_t c = r;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, src + i, 8);
    if (dst != nullptr) std::memcpy(dst + i, &v, 8);
    c = _mm_crc32_u64(c, v);
  }
  for (; i < n; ++i) {
    if (dst != nullptr) dst[i] = src[i];
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), src[i]);
  }
  return static_cast<std::uint32_t>(c);
}

// Three independent lanes over thirds of the bytes (the crc32 instruction
// has a latency of three cycles and a throughput of one), joined by Shift.
__attribute__((target("sse4.2"))) std::uint32_t RawHardware(std::uint32_t r, unsigned char* dst,
                                                            const unsigned char* src,
                                                            std::size_t n) {
  const std::size_t lane = n / 3 / 8 * 8;
  if (lane < 4096) return RawHardwareLane(r, dst, src, n);
  std::uint64_t a = r, b = 0, c = 0;
  const unsigned char* sa = src;
  const unsigned char* sb = src + lane;
  const unsigned char* sc = src + 2 * lane;
  for (std::size_t i = 0; i < lane; i += 8) {
    std::uint64_t va, vb, vc;
    std::memcpy(&va, sa + i, 8);
    std::memcpy(&vb, sb + i, 8);
    std::memcpy(&vc, sc + i, 8);
    if (dst != nullptr) {
      std::memcpy(dst + i, &va, 8);
      std::memcpy(dst + lane + i, &vb, 8);
      std::memcpy(dst + 2 * lane + i, &vc, 8);
    }
    a = _mm_crc32_u64(a, va);
    b = _mm_crc32_u64(b, vb);
    c = _mm_crc32_u64(c, vc);
  }
  std::uint32_t joined = Shift(static_cast<std::uint32_t>(a), lane) ^ static_cast<std::uint32_t>(b);
  joined = Shift(joined, lane) ^ static_cast<std::uint32_t>(c);
  return RawHardwareLane(joined, dst == nullptr ? nullptr : dst + 3 * lane, src + 3 * lane,
                         n - 3 * lane);
}
#endif

std::uint32_t Raw(std::uint32_t r, unsigned char* dst, const unsigned char* src, std::size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return RawHardware(r, dst, src, n);
#endif
  return RawSoftware(r, dst, src, n);
}

}  // namespace

std::uint32_t Crc32c(std::uint32_t crc, const void* p, std::size_t n) {
  return ~Raw(~crc, nullptr, static_cast<const unsigned char*>(p), n);
}

std::uint32_t CopyCrc32c(std::uint32_t crc, void* dst, const void* src, std::size_t n,
                         int threads) {
  if (n == 0) return crc;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  constexpr std::size_t kPerThread = 16u << 20;  // below this a thread costs more than it gives
  const std::size_t parts = std::clamp<std::size_t>(n / kPerThread, 1, std::max(threads, 1));
  if (parts == 1) return ~Raw(~crc, d, s, n);
  const std::size_t part = n / parts / 64 * 64;
  std::vector<std::uint32_t> raw(parts);
  std::vector<std::thread> pool;
  pool.reserve(parts - 1);
  for (std::size_t i = 1; i < parts; ++i) {
    const std::size_t off = i * part, len = i + 1 == parts ? n - off : part;
    try {
      pool.emplace_back(
          [&raw, i, d, s, off, len] { raw[i] = Raw(0, d ? d + off : nullptr, s + off, len); });
    } catch (const std::system_error&) {  // no thread to be had: this one does the part
      raw[i] = Raw(0, d ? d + off : nullptr, s + off, len);
    }
  }
  raw[0] = Raw(~crc, d, s, part);
  for (auto& t : pool) t.join();
  std::uint32_t r = raw[0];
  for (std::size_t i = 1; i < parts; ++i) {
    r = Shift(r, i + 1 == parts ? n - i * part : part) ^ raw[i];
  }
  return ~r;
}

std::uint32_t Crc32cCombine(std::uint32_t crc_a, std::uint32_t crc_b, std::size_t len_b) {
  return Shift(crc_a, len_b) ^ crc_b;
}

int DefaultCopyThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::clamp(cpus, 1, 4);
}

std::uint32_t SnapshotChecksum(std::uint32_t kind, const void* p, std::size_t n) {
  return SnapshotChecksumUpdate(kind, 0, p, n);
}

std::uint32_t SnapshotChecksumUpdate(std::uint32_t kind, std::uint32_t crc, const void* p,
                                     std::size_t n) {
  if (kind != checkpoint_layout::kChecksumCrc32) return Crc32c(crc, p, n);
  return static_cast<std::uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(p), n));
}

}  // namespace ddprun::checkpoint_checksum
