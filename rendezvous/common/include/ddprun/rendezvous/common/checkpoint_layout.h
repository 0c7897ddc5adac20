// The layout of a worker's checkpoint memory (docs/checkpoint.md, "Format"):
// the contract between the agent, which creates it and reads its commit
// records, and the worker side (worker_sdk/python/ddprun/checkpoint.py),
// and the SDK's C++ and C API (worker_sdk/src/checkpoint.cc), which write
// it. Version 3 (2 had no slot count: always two slots; 1 had no checksum
// kind: every record was zlib's CRC-32); every integer little-endian.
//
//   [0, 4096)                            header: magic, version, slot count
//                                        S, slot capacity, S slot records
//   [4096 + s*capacity, + capacity)      slot s's snapshot bytes, s < S
//
// S is 2, or 3 with --ckpt_replicas 1 (docs/checkpoint.md, "Replica lag"):
// the agent writes it when it creates the memory, and every reader and
// writer takes it from the header. A save writes the oldest slot (an empty
// or cut-short one first, else the committed one of the lowest generation),
// never the newest committed one: its record's state goes to kSlotWriting
// first, the bytes and the record after, and kSlotCommitted last. A writer
// that dies midway leaves that slot kSlotWriting and the others untouched,
// so a snapshot is never torn.
#pragma once

#include <cstdint>

namespace ddprun::checkpoint_layout {

inline constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '1'};
inline constexpr std::uint32_t kVersion = 3;
inline constexpr std::uint64_t kHeaderBytes = 4096;
// Slots per memory: two without replicas, three with --ckpt_replicas 1 (a
// save then waits only for the previous snapshot's replica while the newest
// one travels; docs/checkpoint.md, "Replica lag"). Readers refuse others.
inline constexpr std::uint32_t kSlotsPlain = 2;
inline constexpr std::uint32_t kSlotsWithReplicas = 3;
inline constexpr std::uint32_t kMaxSlots = 3;

// Header fields (byte offsets).
inline constexpr std::uint64_t kMagicOffset = 0;         // char[8]
inline constexpr std::uint64_t kVersionOffset = 8;       // u32
inline constexpr std::uint64_t kSlotsOffset = 12;        // u32: the slot count S
inline constexpr std::uint64_t kCapacityOffset = 16;     // u64: bytes per slot
inline constexpr std::uint64_t kLimitOffset = 24;        // u64: --ckpt_shm_limit, as given
inline constexpr std::uint64_t kReplicaGateOffset = 32;  // u64: the replica gate, below
inline constexpr std::uint64_t kSlotRecordsOffset = 64;  // S records
inline constexpr std::uint64_t kSlotRecordBytes = 64;

// One slot record (offsets inside it).
inline constexpr std::uint64_t kStateOffset = 0;          // u32: a SlotState
inline constexpr std::uint64_t kCrcOffset = 4;            // u32: checksum of the bytes
inline constexpr std::uint64_t kGenerationOffset = 8;     // u64: newer saves are higher
inline constexpr std::uint64_t kStepOffset = 16;          // i64: the step given to save
inline constexpr std::uint64_t kSizeOffset = 24;          // u64: bytes in the slot
inline constexpr std::uint64_t kRankOffset = 32;          // i32: the saver's RANK
inline constexpr std::uint64_t kWorldSizeOffset = 36;     // i32: the saver's WORLD_SIZE
inline constexpr std::uint64_t kChecksumKindOffset = 40;  // u32: a ChecksumKind

// What a record's checksum is. Writers use CRC-32C (checkpoint_checksum.h)
// where they have it; Python without the SDK library writes zlib's.
enum ChecksumKind : std::uint32_t { kChecksumCrc32 = 0, kChecksumCrc32c = 1 };

enum SlotState : std::uint32_t { kSlotEmpty = 0, kSlotWriting = 1, kSlotCommitted = 2 };

inline constexpr std::uint64_t SlotRecordOffset(int slot) {
  return kSlotRecordsOffset + static_cast<std::uint64_t>(slot) * kSlotRecordBytes;
}
inline constexpr std::uint64_t SlotDataOffset(int slot, std::uint64_t capacity) {
  return kHeaderBytes + static_cast<std::uint64_t>(slot) * capacity;
}

// The replica gate (--ckpt_replicas 1; docs/checkpoint.md, "Replica lag"),
// written by the agent with one aligned 8-byte store, read by a save after
// its commit. 0: saves do not wait (no successor, or sending to it fails).
// Otherwise 1 + the generation of this rank's newest snapshot whose replica
// the successor acknowledged (1: none yet). A save that committed
// generation g returns once the gate reaches g - 1 (the snapshot committed
// before it, whose transfer overlapped this step; nothing when g is 1) or
// opens, or after DDPRUN_CKPT_REPLICA_WAIT seconds (default below; then one
// line says so): so a node enters step n + 1 only with step n - 1
// replicated, and the successor keeps its last two replicas.
inline constexpr double kDefaultReplicaWaitSeconds = 60;
inline constexpr const char* kEnvReplicaWait = "DDPRUN_CKPT_REPLICA_WAIT";
// After this long a waiting save says once that it waits, and for what.
inline constexpr double kReplicaWaitNoticeSeconds = 5;

// The snapshot bytes of a slot (format 1): a u64 length, a JSON tree of
// that length ({"format": 1, "state": node}), then the data, each blob at
// an offset that is a multiple of kDataAlign from the data's start, which
// is itself 8 + length rounded up to kDataAlign.
inline constexpr int kSnapshotFormat = 1;
inline constexpr std::uint64_t kDataAlign = 64;

// Agreement across nodes (load): each node sets
// kAgreeKeyPrefix + "<job id>/<round>/<group rank>" in the round's TCPStore
// to its steps ("3,4"), and waits up to DDPRUN_CKPT_AGREE_TIMEOUT seconds
// (default below) for every node's key. Both variables are read by the
// workers' checkpoint code only (ddprun sets neither); the second is the
// test hook "RANK:STEP" (docs/checkpoint.md, "Test hook").
inline constexpr const char* kAgreeKeyPrefix = "ddprun_ckpt/";
inline constexpr double kDefaultAgreeTimeoutSeconds = 300;
inline constexpr const char* kEnvAgreeTimeout = "DDPRUN_CKPT_AGREE_TIMEOUT";
inline constexpr const char* kEnvTestDieInSave = "DDPRUN_CKPT_TEST_DIE_IN_SAVE";
// Test hook read by the agent's replica sender (docs/checkpoint.md, "Test
// hook"): milliseconds it sleeps before each replica it sends, a slow link.
inline constexpr const char* kEnvTestReplicaDelayMs = "DDPRUN_CKPT_TEST_REPLICA_DELAY_MS";
// Test hook read by the agent's replica server (docs/checkpoint.md, "Test
// hook"): when "1", a replica it sends to a restore that is not its seat's
// newest goes out with its first byte flipped (what it holds is intact).
inline constexpr const char* kEnvTestReplicaCorruptOlder = "DDPRUN_CKPT_TEST_REPLICA_CORRUPT_OLDER";

}  // namespace ddprun::checkpoint_layout
