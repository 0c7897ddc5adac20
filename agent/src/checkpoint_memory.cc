#include "ddprun/agent/checkpoint_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::agent {
namespace {

namespace layout = checkpoint_layout;

constexpr std::uint64_t kPage = 4096;

template <class T>
T Load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (x86-64, aarch64)
  return v;
}

bool PreadAll(int fd, void* buf, std::size_t n, off_t offset) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
  return true;
}

bool PwriteAll(int fd, const void* buf, std::size_t n, off_t offset) {
  const auto* p = static_cast<const unsigned char*>(buf);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += w;
  }
  return true;
}

}  // namespace

CheckpointMemory::CheckpointMemory(std::uint64_t limit_bytes)
    : limit_(limit_bytes),
      capacity_((limit_bytes + kPage - 1) / kPage * kPage),
      slots_(static_cast<int>(layout::kSlotsPlain)) {}

CheckpointMemory::~CheckpointMemory() {
  for (void* h : headers_) ::munmap(h, layout::kHeaderBytes);
  for (int fd : fds_) ::close(fd);
}

void CheckpointMemory::set_slots(int slots) {
  std::lock_guard<std::mutex> lock(mu_);
  DDPRUN_CHECK(fds_.empty()) << "set_slots after the memory was created";
  DDPRUN_CHECK(slots >= static_cast<int>(layout::kSlotsPlain) &&
               slots <= static_cast<int>(layout::kMaxSlots))
      << "slots " << slots;
  slots_ = slots;
}

int CheckpointMemory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(fds_.size());
}

absl::Status CheckpointMemory::Ensure(int local_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  while (static_cast<int>(fds_.size()) < local_ranks) {
    const int rank = static_cast<int>(fds_.size());
    auto fail = [rank](const char* what, int fd) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      return absl::InternalError(absl::StrCat("cannot create the checkpoint memory of local rank ",
                                              rank, ": ", what, ": ", std::strerror(err),
                                              "; run with --ckpt_shm_limit 0 to go without"));
    };
    const std::string name = absl::StrCat("ddprun-ckpt-", rank);
    const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return fail("memfd_create", fd);
    if (::ftruncate(fd, static_cast<off_t>(layout::kHeaderBytes +
                                           static_cast<std::uint64_t>(slots_) * capacity_)) != 0) {
      return fail("ftruncate", fd);
    }
    unsigned char header[layout::kSlotRecordsOffset] = {};
    std::memcpy(header + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic);
    std::memcpy(header + layout::kVersionOffset, &layout::kVersion, sizeof layout::kVersion);
    const std::uint32_t slots = static_cast<std::uint32_t>(slots_);
    std::memcpy(header + layout::kSlotsOffset, &slots, sizeof slots);
    std::memcpy(header + layout::kCapacityOffset, &capacity_, sizeof capacity_);
    std::memcpy(header + layout::kLimitOffset, &limit_, sizeof limit_);
    if (!PwriteAll(fd, header, sizeof header, 0)) return fail("writing the header", fd);
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
      return fail("sealing", fd);
    }
    void* h = ::mmap(nullptr, layout::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return fail("mapping the header", fd);
    fds_.push_back(fd);
    headers_.push_back(h);
    epochs_.push_back(0);
  }
  return absl::OkStatus();
}

int CheckpointMemory::fd(int local_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(fds_.size())) return -1;
  return fds_[static_cast<std::size_t>(local_rank)];
}

std::vector<CommittedSnapshot> CheckpointMemory::Committed(int local_rank) const {
  std::vector<std::pair<std::uint64_t, CommittedSnapshot>> found;  // by generation
  const int f = fd(local_rank);
  if (f < 0) return {};
  for (int slot = 0; slot < slots_; ++slot) {
    unsigned char rec[layout::kSlotRecordBytes];
    if (!PreadAll(f, rec, sizeof rec, static_cast<off_t>(layout::SlotRecordOffset(slot)))) {
      continue;
    }
    if (Load<std::uint32_t>(rec + layout::kStateOffset) != layout::kSlotCommitted) continue;
    CommittedSnapshot s;
    s.step = Load<std::int64_t>(rec + layout::kStepOffset);
    s.size = Load<std::uint64_t>(rec + layout::kSizeOffset);
    s.rank = Load<std::int32_t>(rec + layout::kRankOffset);
    s.world_size = Load<std::int32_t>(rec + layout::kWorldSizeOffset);
    s.slot = slot;
    s.crc = Load<std::uint32_t>(rec + layout::kCrcOffset);
    s.checksum_kind = Load<std::uint32_t>(rec + layout::kChecksumKindOffset);
    s.generation = Load<std::uint64_t>(rec + layout::kGenerationOffset);
    if (s.size > limit_) continue;  // not a record this layout wrote
    found.emplace_back(s.generation, s);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<CommittedSnapshot> out;
  for (auto& [gen, s] : found) out.push_back(s);
  return out;
}

std::vector<std::int64_t> CheckpointMemory::CommonSteps(int local_ranks, int base_rank,
                                                        int world_size) const {
  std::set<std::int64_t> common;
  for (int j = 0; j < local_ranks; ++j) {
    std::set<std::int64_t> mine;
    for (const CommittedSnapshot& s : Committed(j)) {
      if (s.rank == base_rank + j && s.world_size == world_size) mine.insert(s.step);
    }
    if (j == 0) {
      common = std::move(mine);
    } else {
      std::set<std::int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.end()));
      common = std::move(both);
    }
  }
  return {common.begin(), common.end()};
}

void CheckpointMemory::AddToSpawn(int local_rank, const std::vector<std::int64_t>& common,
                                  SpawnSpec* spec) const {
  const int f = fd(local_rank);
  if (f < 0) {
    RemoveCheckpointEnv(&spec->env);
    return;
  }
  spec->env[kEnvCkptFd] = std::to_string(f);
  spec->env[kEnvCkptSteps] = absl::StrJoin(common, ",");
  spec->inherit_fds.push_back(f);
}

absl::StatusOr<std::string> CheckpointMemory::ReadCommitted(int local_rank,
                                                            const CommittedSnapshot& s,
                                                            std::string reuse) const {
  const int f = fd(local_rank);
  if (f < 0 || s.slot < 0 || s.slot >= slots_ || s.size > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("no snapshot of local rank ", local_rank));
  }
  std::string bytes = std::move(reuse);
  bytes.resize(s.size);  // the same size as last time: no pass over the bytes
  if (!PreadAll(f, bytes.data(), bytes.size(),
                static_cast<off_t>(layout::SlotDataOffset(s.slot, capacity_)))) {
    return absl::InternalError(absl::StrCat("reading the checkpoint memory of local rank ",
                                            local_rank, ": ", std::strerror(errno)));
  }
  // The record after the copy: the same generation, still committed, and
  // the bytes' checksum the one it recorded, or the worker saved over it.
  unsigned char rec[layout::kSlotRecordBytes];
  const bool same =
      PreadAll(f, rec, sizeof rec, static_cast<off_t>(layout::SlotRecordOffset(s.slot))) &&
      Load<std::uint32_t>(rec + layout::kStateOffset) == layout::kSlotCommitted &&
      Load<std::uint64_t>(rec + layout::kGenerationOffset) == s.generation;
  const std::uint32_t crc =
      checkpoint_checksum::SnapshotChecksum(s.checksum_kind, bytes.data(), bytes.size());
  if (!same || crc != s.crc) {
    return absl::UnavailableError(absl::StrCat("the snapshot of step ", s.step, " of local rank ",
                                               local_rank, " was saved over while read"));
  }
  return bytes;
}

absl::Status CheckpointMemory::Seed(int local_rank, std::int64_t step, int rank, int world_size,
                                    const std::string& bytes, int slot_index) {
  if (bytes.size() > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat("the snapshot of step ", step, " needs ",
                                                     bytes.size(),
                                                     " bytes, more than --ckpt_shm_limit (", limit_,
                                                     " bytes per worker); raise --ckpt_shm_limit"));
  }
  if (slot_index == 0 && fd(local_rank) >= 0) Clear(local_rank);  // replaces what it held
  auto slot = BeginSeed(local_rank, bytes.size(), slot_index);
  if (!slot.ok()) return slot.status();
  const std::uint32_t crc = checkpoint_checksum::CopyCrc32c(
      0, slot->data(), bytes.data(), bytes.size(), checkpoint_checksum::DefaultCopyThreads());
  return slot->Commit(step, rank, world_size, crc, layout::kChecksumCrc32c);
}

absl::StatusOr<CheckpointMemory::SeedSlot> CheckpointMemory::BeginSeed(int local_rank,
                                                                       std::uint64_t size,
                                                                       int slot) {
  const int f = fd(local_rank);
  if (f < 0)
    return absl::InvalidArgumentError(absl::StrCat("no memory for local rank ", local_rank));
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("no slot ", slot, " in the checkpoint memory (", slots_, " slots)"));
  }
  if (size > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a snapshot of ", size, " bytes is more than --ckpt_shm_limit (", limit_,
                     " bytes per worker); raise "
                     "--ckpt_shm_limit"));
  }
  // First, so a failure below leaves nothing loadable in this slot.
  const unsigned char empty[layout::kSlotRecordBytes] = {};
  (void)PwriteAll(f, empty, sizeof empty, static_cast<off_t>(layout::SlotRecordOffset(slot)));
  if (size == 0) return SeedSlot(f, slot, nullptr, 0);
  const off_t at = static_cast<off_t>(layout::SlotDataOffset(slot, capacity_));
  auto fail = [&](const char* what) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " the checkpoint memory of local rank ",
                                                     local_rank, ": ", std::strerror(errno)));
  };
  if (::fallocate(f, 0, at, static_cast<off_t>(size)) != 0) return fail("allocating");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, at);
  if (p == MAP_FAILED) return fail("mapping");
  return SeedSlot(f, slot, static_cast<char*>(p), size);
}

CheckpointMemory::SeedSlot::SeedSlot(SeedSlot&& o) noexcept
    : fd_(o.fd_), slot_(o.slot_), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
}

CheckpointMemory::SeedSlot::~SeedSlot() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

absl::Status CheckpointMemory::SeedSlot::Commit(std::int64_t step, int rank, int world_size,
                                                std::uint32_t crc, std::uint32_t checksum_kind) {
  unsigned char rec[layout::kSlotRecordBytes] = {};
  const std::uint32_t state = layout::kSlotCommitted;
  const std::uint64_t generation = static_cast<std::uint64_t>(slot_) + 1;  // oldest in slot 0
  const std::int32_t r = rank, w = world_size;
  std::memcpy(rec + layout::kCrcOffset, &crc, sizeof crc);
  std::memcpy(rec + layout::kGenerationOffset, &generation, sizeof generation);
  std::memcpy(rec + layout::kStepOffset, &step, sizeof step);
  std::memcpy(rec + layout::kSizeOffset, &size_, sizeof size_);
  std::memcpy(rec + layout::kRankOffset, &r, sizeof r);
  std::memcpy(rec + layout::kWorldSizeOffset, &w, sizeof w);
  std::memcpy(rec + layout::kChecksumKindOffset, &checksum_kind, sizeof checksum_kind);
  std::memcpy(rec + layout::kStateOffset, &state, sizeof state);
  if (!PwriteAll(fd_, rec, sizeof rec, static_cast<off_t>(layout::SlotRecordOffset(slot_)))) {
    return absl::InternalError(
        absl::StrCat("writing a checkpoint memory's record: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::uint64_t CheckpointMemory::MemoryBytes(int local_rank) const {
  const int f = fd(local_rank);
  struct stat st;
  if (f < 0 || ::fstat(f, &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;  // st_blocks counts 512-byte units
}

void CheckpointMemory::Clear(int local_rank) {
  const int f = fd(local_rank);
  if (f < 0) return;
  unsigned char rec[layout::kSlotRecordBytes] = {};
  for (int slot = 0; slot < slots_; ++slot) {
    (void)PwriteAll(f, rec, sizeof rec, static_cast<off_t>(layout::SlotRecordOffset(slot)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++epochs_[static_cast<std::size_t>(local_rank)];
  std::atomic_ref<std::uint64_t> word(*GateWord(local_rank));
  if (word.load() != 0) word.store(1, std::memory_order_release);  // closed, nothing acknowledged
}

std::uint64_t* CheckpointMemory::GateWord(int local_rank) const {
  return reinterpret_cast<std::uint64_t*>(
      static_cast<unsigned char*>(headers_[static_cast<std::size_t>(local_rank)]) +
      layout::kReplicaGateOffset);
}

std::uint64_t CheckpointMemory::epoch(int local_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(epochs_.size())) return 0;
  return epochs_[static_cast<std::size_t>(local_rank)];
}

void CheckpointMemory::SetReplicaGate(int local_rank, bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(headers_.size())) return;
  std::atomic_ref<std::uint64_t>(*GateWord(local_rank))
      .store(on ? 1 : 0, std::memory_order_release);
}

bool CheckpointMemory::SetReplicaAcked(int local_rank, std::uint64_t epoch,
                                       std::uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(headers_.size()) ||
      epochs_[static_cast<std::size_t>(local_rank)] != epoch) {
    return false;
  }
  std::atomic_ref<std::uint64_t>(*GateWord(local_rank))
      .store(generation + 1, std::memory_order_release);
  return true;
}

std::uint64_t CheckpointMemory::ReplicaGate(int local_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(headers_.size())) return 0;
  return std::atomic_ref<std::uint64_t>(*GateWord(local_rank)).load(std::memory_order_acquire);
}

void RemoveCheckpointEnv(std::map<std::string, std::string>* env) {
  env->erase(kEnvCkptFd);
  env->erase(kEnvCkptSteps);
  env->erase(kEnvCkptEvery);
}

}  // namespace ddprun::agent
