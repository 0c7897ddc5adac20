// The workers' checkpoint memory (docs/checkpoint.md): one memfd per local
// rank, created and owned by the agent, handed to each worker of that rank
// as an inherited descriptor (DDPRUN_CKPT_FD), in every round. A snapshot
// therefore outlives the worker that saved it, a restarted worker finds it
// again, and it is freed with the agent and its workers: there is no path,
// nothing in /dev/shm, and only processes holding the descriptor reach it.
//
// The memory is sized 4096 + S * limit bytes (S slots: 2, or 3 with
// --ckpt_replicas 1, set_slots; checkpoint_layout.h) and sealed against growing and
// shrinking (F_SEAL_GROW | F_SEAL_SHRINK), so a snapshot cannot exceed
// --ckpt_shm_limit even by a worker that ignores the layout; tmpfs allocates
// pages only when written. The agent reads the commit records
// (checkpoint_layout.h) between rounds, when no worker runs, to give the
// workers their steps; its persister (checkpoint_persister.h) reads
// committed snapshots while workers run (ReadCommitted checks the bytes
// against the record, so a slot saved over meanwhile is never taken).
// Thread-safe: the descriptors are guarded; Seed is for the main thread
// before the round's workers start.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddprun::agent {

struct SpawnSpec;

// A committed snapshot as its record describes it.
struct CommittedSnapshot {
  std::int64_t step = 0;
  std::uint64_t size = 0;
  int rank = 0;        // RANK of the worker that saved it
  int world_size = 0;  // WORLD_SIZE then
  int slot = 0;
  std::uint32_t crc = 0;            // checksum of the snapshot bytes, of checksum_kind
  std::uint32_t checksum_kind = 1;  // checkpoint_layout::ChecksumKind
  std::uint64_t generation = 0;     // higher is newer
};

class CheckpointMemory {
 public:
  // limit_bytes: the largest snapshot of one rank (--ckpt_shm_limit > 0).
  explicit CheckpointMemory(std::uint64_t limit_bytes);
  ~CheckpointMemory();
  CheckpointMemory(const CheckpointMemory&) = delete;
  CheckpointMemory& operator=(const CheckpointMemory&) = delete;

  // The slots of each memory (checkpoint_layout.h: kSlotsPlain, or
  // kSlotsWithReplicas under --ckpt_replicas 1), written into its header.
  // Only before the first Ensure: every rank's memory has the same count.
  void set_slots(int slots);
  int slots() const { return slots_; }
  // Creates the memory of local ranks [0, local_ranks) not created yet.
  // An error names the rank and the cause (memfd_create, sealing).
  absl::Status Ensure(int local_ranks);
  // The descriptor of a local rank's memory (-1 before Ensure).
  int fd(int local_rank) const;
  std::uint64_t slot_capacity() const { return capacity_; }
  std::uint64_t limit() const { return limit_; }
  // The number of local ranks whose memory exists.
  int size() const;

  // The committed snapshots in a local rank's memory, newest first; a
  // record that is not committed (a save cut short) is left out.
  std::vector<CommittedSnapshot> Committed(int local_rank) const;
  // The steps that every local rank j in [0, local_ranks) has committed as
  // RANK base_rank + j of a job of world_size ranks, ascending. A snapshot
  // saved under another rank or world size does not count: after the job's
  // shape changed, no step is common and the workers start fresh.
  std::vector<std::int64_t> CommonSteps(int local_ranks, int base_rank, int world_size) const;

  // Hands local rank j's memory to its worker: DDPRUN_CKPT_FD and
  // DDPRUN_CKPT_STEPS (`common`, as CommonSteps gave) in the spec's
  // environment and the descriptor in its inherited ones.
  void AddToSpawn(int local_rank, const std::vector<std::int64_t>& common, SpawnSpec* spec) const;

  // The bytes of a committed snapshot `s` (as Committed gave it) of a local
  // rank. kUnavailable when the worker saved over the slot meanwhile (the
  // record changed or the checksum does not match): try again later. The
  // bytes are read into `reuse` (resized): a caller that hands back the
  // previous result reads into memory already in use, not fresh pages.
  absl::StatusOr<std::string> ReadCommitted(int local_rank, const CommittedSnapshot& s,
                                            std::string reuse = {}) const;
  // Writes `bytes` (a snapshot in format 1) into slot `slot` of a local
  // rank's memory as committed step `step` of RANK `rank` in a job of
  // `world_size` ranks, with generation slot + 1: the persisted snapshot a
  // job resumes from (slot 0), or the replicas a lost node's seat is
  // restored from, oldest in slot 0. Slot 0 replaces whatever the memory
  // held (every record cleared first); a later slot only its own. Only while
  // no worker of that rank runs. An error names the size and
  // --ckpt_shm_limit when it does not fit.
  absl::Status Seed(int local_rank, std::int64_t step, int rank, int world_size,
                    const std::string& bytes, int slot = 0);

  // Seed without the copy: slot `slot` of a local rank's memory, its record
  // cleared (the slot holds nothing loadable; the other slots are left as
  // they are, so a restore clears the memory first and may fill its slots in
  // any order) and mapped for the snapshot's `size` bytes to be written in
  // place (a replica received straight into it), then committed with the
  // checksum its sender stated, already checked by the writer, and
  // generation slot + 1. Its pages are allocated and mapped up front, so
  // writing them takes no page faults.
  class SeedSlot {
   public:
    SeedSlot(SeedSlot&& o) noexcept;
    SeedSlot& operator=(SeedSlot&&) = delete;
    ~SeedSlot();
    char* data() const { return data_; }
    absl::Status Commit(std::int64_t step, int rank, int world_size, std::uint32_t crc,
                        std::uint32_t checksum_kind);

   private:
    friend class CheckpointMemory;
    SeedSlot(int fd, int slot, char* data, std::uint64_t size)
        : fd_(fd), slot_(slot), data_(data), size_(size) {}
    int fd_;
    int slot_;
    char* data_;  // null for an empty snapshot
    std::uint64_t size_;
  };
  absl::StatusOr<SeedSlot> BeginSeed(int local_rank, std::uint64_t size, int slot = 0);
  // Empties every slot's record of a local rank: nothing loadable.
  void Clear(int local_rank);

  // The replica gate of a local rank's memory (checkpoint_layout.h,
  // kReplicaGateOffset; docs/checkpoint.md, "Replica lag"), for the replica
  // sender. SetReplicaGate opens it (on = false: saves do not wait) or closes
  // it with nothing acknowledged. SetReplicaAcked records that the replica
  // of the snapshot of `generation` is acknowledged, closing the gate up to
  // it, unless the memory's contents were replaced (Seed, Clear) since
  // `epoch` was read; it returns whether it did. Seed and Clear leave the
  // gate open or closed and forget what was acknowledged.
  std::uint64_t epoch(int local_rank) const;
  void SetReplicaGate(int local_rank, bool on);
  bool SetReplicaAcked(int local_rank, std::uint64_t epoch, std::uint64_t generation);
  // The gate word as workers read it (0: open; else 1 + the acknowledged generation).
  std::uint64_t ReplicaGate(int local_rank) const;
  // The bytes of memory a local rank's checkpoint memory holds now (its
  // pages in use, as fstat counts them); 0 before Ensure.
  std::uint64_t MemoryBytes(int local_rank) const;

 private:
  std::uint64_t limit_;     // --ckpt_shm_limit
  std::uint64_t capacity_;  // bytes per slot: the limit rounded up to a page
  int slots_;               // per memory (set_slots)
  // The gate word of each local rank's memory, in a mapping of its header.
  std::uint64_t* GateWord(int local_rank) const;

  mutable std::mutex mu_;  // guards fds_, gates_ and epochs_
  std::vector<int> fds_;
  std::vector<void*> headers_;         // each memory's header page, mapped
  std::vector<std::uint64_t> epochs_;  // bumped by Clear (and so Seed)
};

// Without checkpoint memory (--ckpt_shm_limit 0): the variables are erased,
// never inherited from the agent's environment.
void RemoveCheckpointEnv(std::map<std::string, std::string>* env);

}  // namespace ddprun::agent
