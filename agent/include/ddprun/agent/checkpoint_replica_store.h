// The replicas an agent holds for other nodes (--ckpt_replicas): the newest
// complete replica per seat (checkpoint_replica_wire.h's Seat), each local
// rank's snapshot in a memfd the agent owns (no path, nothing in /dev/shm;
// freed with the agent). A replica being received is written into memory of
// its own and becomes visible only when complete (Commit), replacing the
// seat's older one, so a reader never sees a partial replica; readers hold a
// shared_ptr, so a replaced replica lives until its last reader is done.
// The memory of a replaced (or abandoned) replica that no reader holds is
// kept as the seat's spare and reused by its next replica of the same sizes:
// a transfer then writes pages already in memory instead of faulting in
// fresh ones (on the build VM that was most of a transfer's CPU time). A
// seat thus keeps up to two replicas' memory, what a transfer needs anyway.
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
  HeldReplica(replica::Seat seat, std::int64_t step, std::vector<std::uint64_t> sizes,
              std::vector<std::uint32_t> crcs, std::vector<std::uint32_t> kinds);
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

  // A replica ready to be filled (not visible until Commit).
  absl::StatusOr<std::shared_ptr<HeldReplica>> Begin(const replica::Header& put);
  // Makes a filled replica its seat's, unless the seat holds a newer step.
  void Commit(std::shared_ptr<HeldReplica> r);
  // A replica that Begin gave and that was not filled (the sender stopped):
  // its memory becomes the seat's spare.
  void Abandon(std::shared_ptr<HeldReplica> r);
  // The seat's replica, or nullptr.
  std::shared_ptr<const HeldReplica> Find(const replica::Seat& seat) const;
  // Every held replica, for publishing which seats this node can restore.
  std::vector<std::shared_ptr<const HeldReplica>> All() const;

 private:
  mutable std::mutex mu_;
  // Keeps `r`'s memory as its seat's spare unless the seat has one (mu_ held).
  void KeepSpare(std::shared_ptr<HeldReplica> r);

  std::map<replica::Seat, std::shared_ptr<HeldReplica>> held_;
  std::map<replica::Seat, std::shared_ptr<HeldReplica>>
      spare_;                                           // seats in held_ (or arriving) only
  std::map<replica::Seat, std::uint64_t> received_at_;  // a counter: least recent goes first
  std::uint64_t counter_ = 0;
};

}  // namespace ddprun::agent
