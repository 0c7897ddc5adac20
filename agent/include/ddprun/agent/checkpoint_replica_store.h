// The replicas an agent holds for other nodes (--ckpt_replicas): per seat
// (checkpoint_replica_wire.h's Seat) its newest complete replica and the one
// before it, each local rank's snapshot in a memfd the agent owns (no path,
// nothing in /dev/shm; freed with the agent). A replica being received is
// written into memory of its own and becomes visible only when complete
// (Commit), so a reader never sees a partial replica; readers hold a
// shared_ptr, so a replaced replica lives until its last reader is done.
//
// The newest two (docs/checkpoint.md, "Replica lag"): a sender's save waits
// only for the replica of the snapshot before its newest, so the survivors
// of a lost node may hold that one and not the newest; both are kept and
// both are offered to a restore. When a transfer begins (Begin), the older
// of the two is evicted and its memory, when no reader holds it, receives
// the arriving replica; Commit then makes the arriving one the newest and
// the former newest the previous one. A seat thus holds two replicas'
// memory at all times (two complete, or the newest and the arriving one),
// as the single replica plus its spare did before. The memory of an
// abandoned transfer is the seat's spare, for its next one. Memory of other
// sizes is freed before new memory is allocated. A transfer writes pages
// already in memory instead of faulting in fresh ones (on the build VM that
// was most of a transfer's CPU time).
//
// Bounds: each snapshot at most the agent's --ckpt_shm_limit (the wire's
// ParseHeader refuses larger ones first), at most kMaxSeats seats (the least
// recently received one is dropped). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/agent/checkpoint_replica_wire.h"

namespace ddprun::agent {

// One complete replica: the snapshots of a seat's local ranks at one step.
class HeldReplica {
 public:
  HeldReplica(replica::Seat seat, std::int64_t round, std::int64_t step,
              std::vector<std::uint64_t> sizes, std::vector<std::uint32_t> crcs,
              std::vector<std::uint32_t> kinds);
  ~HeldReplica();
  HeldReplica(const HeldReplica&) = delete;
  HeldReplica& operator=(const HeldReplica&) = delete;

  // Creates and maps the memory (one memfd per local rank), unless
  // TakeMemory gave it. An error names the cause (memfd_create, fallocate,
  // mmap: out of memory).
  absl::Status Allocate();
  // Takes `from`'s memory when it has this replica's sizes (its bytes are
  // then overwritten; `from` is left without memory); false otherwise.
  bool TakeMemory(HeldReplica& from);
  const replica::Seat& seat() const { return seat_; }
  // The round whose sender put it (the job's rendezvous round).
  std::int64_t round() const { return round_; }
  std::int64_t step() const { return step_; }
  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  const std::vector<std::uint32_t>& crcs() const { return crcs_; }
  const std::vector<std::uint32_t>& kinds() const { return kinds_; }
  // Local rank j's bytes (Allocate first); writable only before Commit.
  char* data(int j) const { return maps_[static_cast<std::size_t>(j)]; }
  // Local rank j's bytes, checked against their CRC-32: DataLoss names the
  // rank and both checksums when they differ.
  absl::StatusOr<std::string> Read(int j) const;

 private:
  replica::Seat seat_;
  std::int64_t round_;
  std::int64_t step_;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::uint32_t> crcs_;
  std::vector<std::uint32_t> kinds_;
  std::vector<int> fds_;
  std::vector<char*> maps_;
};

class ReplicaStore {
 public:
  static constexpr std::size_t kMaxSeats = 2;

  // Replicas are ordered by (round, step): a later round's replica is newer
  // than any of an earlier round. A replica of an earlier round whose step
  // is at or after an arriving replica's step is stale (the job went back to
  // an older step in between, so it belongs to a timeline the job left): it
  // goes when that replica begins, and is never offered to a restore again.
  //
  // A replica ready to be filled (not visible until Commit). Evicts the
  // stale ones and, when the arriving replica is newer than the seat's
  // newest, the older of its two complete replicas; the evicted memory (or
  // the seat's spare) is reused when it has the arriving replica's sizes.
  absl::StatusOr<std::shared_ptr<HeldReplica>> Begin(const replica::Header& put);
  // Makes a filled replica its seat's newest (the newest so far becomes the
  // previous one; stale ones go), unless the seat's newest is newer (a
  // newer one arrived first): then false and nothing changes. One of the
  // same round and step replaces the newest.
  bool Commit(std::shared_ptr<HeldReplica> r);
  // A replica that Begin gave and that was not filled (the sender stopped):
  // its memory becomes the seat's spare.
  void Abandon(std::shared_ptr<HeldReplica> r);
  // The seat's newest replica, or nullptr.
  std::shared_ptr<const HeldReplica> Find(const replica::Seat& seat) const;
  // The seat's replica of `step`, or nullptr.
  std::shared_ptr<const HeldReplica> Find(const replica::Seat& seat, std::int64_t step) const;
  // The seat's complete replicas, oldest first (at most two).
  std::vector<std::shared_ptr<const HeldReplica>> FindAll(const replica::Seat& seat) const;
  // Every held replica, for publishing which seats and steps this node can
  // restore.
  std::vector<std::shared_ptr<const HeldReplica>> All() const;

 private:
  // One seat's replicas.
  struct SeatReplicas {
    std::shared_ptr<HeldReplica> newest;
    std::shared_ptr<HeldReplica> previous;  // the one before newest, or null
    std::shared_ptr<HeldReplica> spare;     // memory without a replica, or null
    std::uint64_t received_at = 0;          // a counter: least recent seat goes first
  };
  mutable std::mutex mu_;
  // Keeps `r`'s memory as the seat's spare unless it has one or a reader
  // holds `r` (mu_ held).
  static void KeepSpare(SeatReplicas& seat, std::shared_ptr<HeldReplica> r);
  // Moves the seat's stale replicas (Stale above, against an arriving
  // replica of (round, step)) to `out`; the newest left stays the newest.
  static void DropStale(SeatReplicas& seat, std::int64_t round, std::int64_t step,
                        std::vector<std::shared_ptr<HeldReplica>>& out);

  std::map<replica::Seat, SeatReplicas> seats_;
  std::uint64_t counter_ = 0;
};

}  // namespace ddprun::agent
