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

HeldReplica::HeldReplica(replica::Seat seat, std::int64_t step, std::vector<std::uint64_t> sizes,
                         std::vector<std::uint32_t> crcs, std::vector<std::uint32_t> kinds)
    : seat_(seat),
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

absl::StatusOr<std::shared_ptr<HeldReplica>> ReplicaStore::Begin(const replica::Header& put) {
  auto r = std::make_shared<HeldReplica>(put.seat, put.step, put.sizes, put.crcs, put.kinds);
  std::shared_ptr<HeldReplica> spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spare_.find(put.seat);
    if (it != spare_.end()) {
      spare = std::move(it->second);
      spare_.erase(it);
    }
  }
  if (spare != nullptr && r->TakeMemory(*spare)) return r;
  spare.reset();  // other sizes: freed before the new memory is allocated
  if (absl::Status st = r->Allocate(); !st.ok()) return st;
  return r;
}

void ReplicaStore::KeepSpare(std::shared_ptr<HeldReplica> r) {
  // Only the store's own reference (Find and All copy under mu_): no reader
  // can be reading its bytes while they are overwritten.
  if (r != nullptr && r.use_count() == 1 && spare_.count(r->seat()) == 0) {
    const replica::Seat seat = r->seat();
    spare_[seat] = std::move(r);
  }
}

void ReplicaStore::Abandon(std::shared_ptr<HeldReplica> r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_.count(r->seat()) != 0) KeepSpare(std::move(r));
}

void ReplicaStore::Commit(std::shared_ptr<HeldReplica> r) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(r->seat());
  if (it != held_.end() && it->second->step() > r->step()) return;  // a newer one arrived first
  const replica::Seat seat = r->seat();
  std::shared_ptr<HeldReplica> replaced = std::move(held_[seat]);
  held_[seat] = std::move(r);
  KeepSpare(std::move(replaced));
  received_at_[seat] = ++counter_;
  while (held_.size() > kMaxSeats) {
    auto oldest = received_at_.begin();
    for (auto i = received_at_.begin(); i != received_at_.end(); ++i) {
      if (i->second < oldest->second) oldest = i;
    }
    held_.erase(oldest->first);
    spare_.erase(oldest->first);
    received_at_.erase(oldest);
  }
}

std::shared_ptr<const HeldReplica> ReplicaStore::Find(const replica::Seat& seat) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(seat);
  return it == held_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const HeldReplica>> ReplicaStore::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const HeldReplica>> out;
  for (const auto& [seat, r] : held_) out.push_back(r);
  return out;
}

}  // namespace ddprun::agent
