// InplaceBlocks (inplace_blocks.h).
#include "ddprun/agent/inplace_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/inplace_layout.h"

namespace ddprun::agent {
namespace {

namespace layout = inplace_layout;

template <class T>
std::atomic_ref<T> Field(unsigned char* base, std::uint64_t offset) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(base + offset));
}

}  // namespace

InplaceBlocks::~InplaceBlocks() {
  for (Block& b : blocks_) {
    if (b.base != nullptr) ::munmap(b.base, layout::kBlockBytes);
    if (b.fd >= 0) ::close(b.fd);
  }
}

absl::Status InplaceBlocks::Ensure(int local_ranks) {
  while (static_cast<int>(blocks_.size()) < local_ranks) {
    const int rank = static_cast<int>(blocks_.size());
    auto fail = [rank](const char* what, int fd) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      return absl::InternalError(absl::StrCat(
          "cannot create the in-place control block of local "
          "rank ",
          rank, ": ", what, ": ", std::strerror(err), "; run with --restart_policy=job"));
    };
    const std::string name = absl::StrCat("ddprun-inplace-", rank);
    const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0) return fail("memfd_create", fd);
    if (::ftruncate(fd, static_cast<off_t>(layout::kBlockBytes)) != 0) return fail("ftruncate", fd);
    void* p = ::mmap(nullptr, layout::kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return fail("mmap", fd);
    Block b{fd, static_cast<unsigned char*>(p)};
    std::memcpy(b.base + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic);
    Field<std::uint32_t>(b.base, layout::kVersionOffset).store(layout::kVersion);
    Field<std::uint32_t>(b.base, layout::kBlockBytesOffset)
        .store(static_cast<std::uint32_t>(layout::kBlockBytes));
    blocks_.push_back(b);
  }
  return absl::OkStatus();
}

void InplaceBlocks::AddToSpawn(int local_rank, SpawnSpec* spec) {
  if (local_rank < 0 || local_rank >= size()) {
    RemoveInplaceEnv(&spec->env);
    return;
  }
  unsigned char* base = blocks_[local_rank].base;
  const std::uint64_t gen = Field<std::uint64_t>(base, layout::kGenerationOffset).load();
  Field<std::uint32_t>(base, layout::kWorkerFlagsOffset).store(0);
  Field<std::uint32_t>(base, layout::kWorkerPidOffset).store(0);
  Field<std::uint64_t>(base, layout::kWorkerAckOffset).store(gen);
  Field<std::uint32_t>(base, layout::kStateOffset).store(layout::kRunning);
  spec->env[layout::kEnvFd] = std::to_string(blocks_[local_rank].fd);
  spec->inherit_fds.push_back(blocks_[local_rank].fd);
}

bool InplaceBlocks::Registered(int local_rank, pid_t pid) const {
  if (local_rank < 0 || local_rank >= size()) return false;
  unsigned char* base = blocks_[local_rank].base;
  const std::uint32_t flags = Field<std::uint32_t>(base, layout::kWorkerFlagsOffset).load();
  const std::uint32_t who = Field<std::uint32_t>(base, layout::kWorkerPidOffset).load();
  return (flags & layout::kFlagCanReform) != 0 && static_cast<pid_t>(who) == pid;
}

void InplaceBlocks::Break(int local_rank) {
  if (local_rank < 0 || local_rank >= size()) return;
  unsigned char* base = blocks_[local_rank].base;
  Field<std::uint32_t>(base, layout::kStateOffset).store(layout::kBroken);
  Field<std::uint64_t>(base, layout::kGenerationOffset).fetch_add(1);
}

bool InplaceBlocks::Broken(int local_rank) const {
  if (local_rank < 0 || local_rank >= size()) return false;
  return Field<std::uint32_t>(blocks_[local_rank].base, layout::kStateOffset).load() ==
         layout::kBroken;
}

absl::Status InplaceBlocks::Publish(int local_rank, const std::map<std::string, std::string>& vars,
                                    std::int64_t round) {
  if (local_rank < 0 || local_rank >= size()) {
    return absl::InternalError(
        absl::StrCat("no in-place control block for local rank ", local_rank));
  }
  std::string blob;
  for (const auto& [k, v] : vars) absl::StrAppend(&blob, k, "=", v, std::string(1, '\0'));
  if (blob.size() > layout::kEnvCapacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the new round's environment (", blob.size(), " bytes) does not fit the ",
                     layout::kEnvCapacity, " bytes of the in-place control block"));
  }
  unsigned char* base = blocks_[local_rank].base;
  std::memcpy(base + layout::kEnvOffset, blob.data(), blob.size());
  Field<std::uint32_t>(base, layout::kEnvBytesOffset)
      .store(static_cast<std::uint32_t>(blob.size()));
  Field<std::uint64_t>(base, layout::kRoundOffset).store(static_cast<std::uint64_t>(round));
  Field<std::uint32_t>(base, layout::kStateOffset).store(layout::kReady, std::memory_order_release);
  return absl::OkStatus();
}

bool InplaceBlocks::Acked(int local_rank) const {
  if (local_rank < 0 || local_rank >= size()) return false;
  unsigned char* base = blocks_[local_rank].base;
  return Field<std::uint64_t>(base, layout::kWorkerAckOffset).load(std::memory_order_acquire) >=
         Field<std::uint64_t>(base, layout::kGenerationOffset).load();
}

void InplaceBlocks::SetRunning(int local_rank) {
  if (local_rank < 0 || local_rank >= size()) return;
  Field<std::uint32_t>(blocks_[local_rank].base, layout::kStateOffset).store(layout::kRunning);
}

std::uint64_t InplaceBlocks::generation(int local_rank) const {
  if (local_rank < 0 || local_rank >= size()) return 0;
  return Field<std::uint64_t>(blocks_[local_rank].base, layout::kGenerationOffset).load();
}

void RemoveInplaceEnv(std::map<std::string, std::string>* env) { env->erase(layout::kEnvFd); }

std::map<std::string, std::string> ChangedVariables(
    const std::map<std::string, std::string>& current,
    const std::map<std::string, std::string>& next) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : next) {
    auto it = current.find(k);
    if (it == current.end() || it->second != v) out.emplace(k, v);
  }
  return out;
}

}  // namespace ddprun::agent
