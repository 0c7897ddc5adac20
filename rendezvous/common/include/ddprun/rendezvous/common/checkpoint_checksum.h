// The checksum of a checkpoint snapshot (checkpoint_layout.h, version 2):
// CRC-32C (Castagnoli, the iSCSI polynomial, reflected 0x82F63B78, initial
// and final XOR 0xFFFFFFFF; "123456789" -> 0xE3069283), computed with the
// CPU's crc32 instruction where it has one and a table otherwise. Shared by
// the agent (which verifies and seeds snapshots), the C++ SDK and the
// Python package (through the SDK library's ddp_ckpt_copy_crc32c), so that
// every side computes the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun::checkpoint_checksum {

// The CRC-32C of `n` bytes at `p` continued from `crc` (0 for the first
// piece): Crc32c(Crc32c(0, a), b) == Crc32c(0, a || b).
std::uint32_t Crc32c(std::uint32_t crc, const void* p, std::size_t n);

// Copies `n` bytes from `src` to `dst` (which must not overlap) and returns
// Crc32c(crc, src, n), reading `src` once; a null `dst` only checksums (in
// the same threads: a snapshot read where it lies). Copies of 32 MiB and more are
// split over up to `threads` threads (1: none), one per 16 MiB at most,
// whose results combine into the same value.
std::uint32_t CopyCrc32c(std::uint32_t crc, void* dst, const void* src, std::size_t n, int threads);

// The CRC-32C of a || b from crc_a = Crc32c(0, a), crc_b = Crc32c(0, b) and
// b's length.
std::uint32_t Crc32cCombine(std::uint32_t crc_a, std::uint32_t crc_b, std::size_t len_b);

// The checksum of `n` bytes of a snapshot as a commit record of `kind`
// (checkpoint_layout::ChecksumKind) states it: zlib's CRC-32 for
// kChecksumCrc32 (records Python wrote without the SDK library), CRC-32C for
// every other kind. The one place both kinds are computed: the agent, its
// replicas and the C++ SDK verify through it.
std::uint32_t SnapshotChecksum(std::uint32_t kind, const void* p, std::size_t n);
// SnapshotChecksum continued from `crc` (0 for the first piece), for bytes
// checked piece by piece as they arrive.
std::uint32_t SnapshotChecksumUpdate(std::uint32_t kind, std::uint32_t crc, const void* p,
                                     std::size_t n);

// The default of CopyCrc32c's `threads` for a worker: min(4, the CPUs this
// process may run on).
int DefaultCopyThreads();

}  // namespace ddprun::checkpoint_checksum
