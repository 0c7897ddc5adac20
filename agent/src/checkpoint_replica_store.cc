#include "ddprun/agent/checkpoint_replica_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"

namespace ddprun::agent {

HeldReplica::HeldReplica(replica::Seat seat, std::int64_t round, std::int64_t step,
                         std::vector<std::uint64_t> sizes, std::vector<std::uint32_t> crcs,
                         std::vector<std::uint32_t> kinds)
    : seat_(seat),
      round_(round),
      step_(step),
      sizes_(std::move(sizes)),
      crcs_(std::move(crcs)),
      kinds_(std::move(kinds)) {
  kinds_.resize(sizes_.size(), checkpoint_layout::kChecksumCrc32);
}

HeldReplica::~HeldReplica() {
  for (std::size_t j = 0; j < maps_.size(); ++j) {
    if (maps_[j] != nullptr) ::munmap(maps_[j], sizes_[j]);
  }
  for (int fd : fds_) ::close(fd);
}

bool HeldReplica::TakeMemory(HeldReplica& from) {
  if (!fds_.empty() || from.sizes_ != sizes_ || from.fds_.size() != sizes_.size()) return false;
  fds_.swap(from.fds_);
  maps_.swap(from.maps_);
  return true;
}

absl::Status HeldReplica::Allocate() {
  if (!fds_.empty() || sizes_.empty()) return absl::OkStatus();  // TakeMemory gave it
  for (std::size_t j = 0; j < sizes_.size(); ++j) {
    const int fd = ::memfd_create("ddprun-replica", MFD_CLOEXEC);
    if (fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("memfd_create for a replica: ", std::strerror(errno)));
    }
    fds_.push_back(fd);
    maps_.push_back(nullptr);
    if (sizes_[j] == 0) continue;
    // fallocate, not ftruncate: a full memory cgroup is an error here, not
    // a SIGBUS while the bytes arrive.
    if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(sizes_[j])); rc != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", sizes_[j], " bytes for a replica: ", std::strerror(rc)));
    }
    void* p = ::mmap(nullptr, sizes_[j], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of a replica: ", std::strerror(errno)));
    }
    maps_.back() = static_cast<char*>(p);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HeldReplica::Read(int j) const {
  const auto i = static_cast<std::size_t>(j);
  std::string bytes(sizes_[i], '\0');
  if (sizes_[i] > 0) std::memcpy(bytes.data(), maps_[i], sizes_[i]);
  const std::uint32_t crc =
      checkpoint_checksum::SnapshotChecksum(kinds_[i], bytes.data(), bytes.size());
  if (crc != crcs_[i]) {
    return absl::DataLossError(
        absl::StrFormat("the replica of step %d of rank %d has checksum %08x, its record says %08x",
                        step_, seat_.base_rank + j, crc, crcs_[i]));
  }
  return bytes;
}

namespace {

// a is newer than (round, step): a later round, or the same round and a
// later step.
bool NewerThan(const HeldReplica& a, std::int64_t round, std::int64_t step) {
  return a.round() > round || (a.round() == round && a.step() > step);
}

// a is older than (round, step): an earlier round, or the same round and
// an earlier step.
bool OlderThan(const HeldReplica& a, std::int64_t round, std::int64_t step) {
  return a.round() < round || (a.round() == round && a.step() < step);
}

// h belongs to a timeline the job left: an earlier round than (round, step)
// and a step at or after it.
bool Stale(const std::shared_ptr<HeldReplica>& h, std::int64_t round, std::int64_t step) {
  return h != nullptr && h->round() < round && h->step() >= step;
}

}  // namespace

void ReplicaStore::DropStale(SeatReplicas& seat, std::int64_t round, std::int64_t step,
                             std::vector<std::shared_ptr<HeldReplica>>& out) {
  if (Stale(seat.previous, round, step)) out.push_back(std::move(seat.previous));
  if (Stale(seat.newest, round, step)) {
    out.push_back(std::move(seat.newest));
    seat.newest = std::move(seat.previous);
  }
}

absl::StatusOr<std::shared_ptr<HeldReplica>> ReplicaStore::Begin(const replica::Header& put) {
  auto r =
      std::make_shared<HeldReplica>(put.seat, put.round, put.step, put.sizes, put.crcs, put.kinds);
  std::vector<std::shared_ptr<HeldReplica>> evicted;  // freed after mu_ is released
  std::shared_ptr<HeldReplica> spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seats_.find(put.seat);
    if (it != seats_.end()) {
      SeatReplicas& seat = it->second;
      DropStale(seat, put.round, put.step, evicted);
      // A newer replica begins: the older of the two goes now, so the seat
      // keeps two replicas' memory, the newest and the arriving one. An
      // older or equal one (sent again) evicts nothing.
      if (seat.newest != nullptr && seat.previous != nullptr &&
          OlderThan(*seat.newest, put.round, put.step)) {
        evicted.push_back(std::move(seat.previous));
      }
      bool reusable = false;
      for (const auto& e : evicted) reusable = reusable || e.use_count() == 1;
      if (!reusable) spare = std::move(seat.spare);
    }
  }
  // Only the store's own reference (Find and All copy under mu_): no reader
  // can be reading an evicted replica's bytes while they are overwritten.
  for (auto& e : evicted) {
    if (e.use_count() == 1 && r->TakeMemory(*e)) return r;
  }
  if (spare != nullptr && r->TakeMemory(*spare)) return r;
  evicted.clear();  // other sizes: freed before the new memory is allocated
  spare.reset();
  if (absl::Status st = r->Allocate(); !st.ok()) return st;
  return r;
}

void ReplicaStore::KeepSpare(SeatReplicas& seat, std::shared_ptr<HeldReplica> r) {
  if (r != nullptr && r.use_count() == 1 && seat.spare == nullptr) seat.spare = std::move(r);
}

void ReplicaStore::Abandon(std::shared_ptr<HeldReplica> r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seats_.find(r->seat());
  if (it != seats_.end() && it->second.newest != nullptr && it->second.previous == nullptr) {
    KeepSpare(it->second, std::move(r));
  }
}

bool ReplicaStore::Commit(std::shared_ptr<HeldReplica> r) {
  std::vector<std::shared_ptr<HeldReplica>> dropped;  // freed after mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  SeatReplicas& seat = seats_[r->seat()];
  if (seat.newest != nullptr && NewerThan(*seat.newest, r->round(), r->step())) {
    // A newer one arrived first (an older round's slow transfer, say).
    if (seat.previous == nullptr) KeepSpare(seat, std::move(r));
    return false;
  }
  DropStale(seat, r->round(), r->step(), dropped);
  if (seat.newest != nullptr && seat.newest->round() == r->round() &&
      seat.newest->step() == r->step()) {
    dropped.push_back(std::move(seat.newest));  // the same step sent again: it replaces the newest
  } else {
    if (seat.previous != nullptr) dropped.push_back(std::move(seat.previous));
    seat.previous = std::move(seat.newest);
  }
  seat.newest = std::move(r);
  if (seat.previous != nullptr) {
    seat.spare.reset();  // two replicas held: no third memory
  } else {
    for (auto& d : dropped) KeepSpare(seat, std::move(d));
  }
  seat.received_at = ++counter_;
  for (;;) {
    auto oldest = seats_.end();
    std::size_t held = 0;
    for (auto i = seats_.begin(); i != seats_.end(); ++i) {
      if (i->second.newest == nullptr) continue;
      ++held;
      if (oldest == seats_.end() || i->second.received_at < oldest->second.received_at) oldest = i;
    }
    if (held <= kMaxSeats) break;
    seats_.erase(oldest);
  }
  return true;
}

std::shared_ptr<const HeldReplica> ReplicaStore::Find(const replica::Seat& seat) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seats_.find(seat);
  return it == seats_.end() ? nullptr : it->second.newest;
}

std::shared_ptr<const HeldReplica> ReplicaStore::Find(const replica::Seat& seat,
                                                      std::int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seats_.find(seat);
  if (it == seats_.end()) return nullptr;
  for (const auto& r : {it->second.newest, it->second.previous}) {
    if (r != nullptr && r->step() == step) return r;
  }
  return nullptr;
}

std::vector<std::shared_ptr<const HeldReplica>> ReplicaStore::FindAll(
    const replica::Seat& seat) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const HeldReplica>> out;
  auto it = seats_.find(seat);
  if (it == seats_.end()) return out;
  if (it->second.previous != nullptr) out.push_back(it->second.previous);
  if (it->second.newest != nullptr) out.push_back(it->second.newest);
  return out;
}

std::vector<std::shared_ptr<const HeldReplica>> ReplicaStore::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const HeldReplica>> out;
  for (const auto& [seat, r] : seats_) {
    if (r.previous != nullptr) out.push_back(r.previous);
    if (r.newest != nullptr) out.push_back(r.newest);
  }
  return out;
}

}  // namespace ddprun::agent
