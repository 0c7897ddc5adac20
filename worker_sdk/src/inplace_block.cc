#include "inplace_block.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/inplace_layout.h"

namespace ddp::detail {
namespace {

namespace layout = ddprun::inplace_layout;

// How often WaitReady looks at the block: well under the 100 ms re-form goal.
constexpr auto kReadyPoll = std::chrono::microseconds(200);

template <class T>
std::atomic<T>* At(char* base, std::uint64_t offset) {
  static_assert(std::atomic<T>::is_always_lock_free && sizeof(std::atomic<T>) == sizeof(T));
  return reinterpret_cast<std::atomic<T>*>(base + offset);
}

absl::Status BadBlock(const std::string& text, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      layout::kEnvFd, "='", text, "' is not the in-place control block (", why,
      "); the agent sets it under --restart_policy=inplace: leave it as ddprun set it"));
}

}  // namespace

InplaceBlock::InplaceBlock(char* base)
    : base_(base),
      generation_(At<std::uint64_t>(base, layout::kGenerationOffset)),
      state_(At<std::uint32_t>(base, layout::kStateOffset)),
      flags_(At<std::uint32_t>(base, layout::kWorkerFlagsOffset)),
      ack_(At<std::uint64_t>(base, layout::kWorkerAckOffset)),
      pid_(At<std::uint32_t>(base, layout::kWorkerPidOffset)),
      env_bytes_(At<std::uint32_t>(base, layout::kEnvBytesOffset)),
      round_(At<std::uint64_t>(base, layout::kRoundOffset)) {}

InplaceBlock::~InplaceBlock() { ::munmap(base_, layout::kBlockBytes); }

absl::StatusOr<std::unique_ptr<InplaceBlock>> InplaceBlock::Map(int fd, const std::string& name) {
  void* p = ::mmap(nullptr, layout::kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return BadBlock(name, absl::StrCat("mmap: ", std::strerror(errno)));
  char* base = static_cast<char*>(p);
  std::uint32_t version = 0;
  std::memcpy(&version, base + layout::kVersionOffset, sizeof version);
  if (std::memcmp(base + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic) != 0 ||
      version != layout::kVersion) {
    ::munmap(p, layout::kBlockBytes);
    return BadBlock(name, absl::StrCat("no magic DDPINPL1 version ", layout::kVersion, " there"));
  }
  return std::unique_ptr<InplaceBlock>(new InplaceBlock(base));
}

absl::StatusOr<InplaceBlock*> InplaceBlock::Get() {
  static std::mutex mu;
  static InplaceBlock* block = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (block != nullptr) return block;
  const char* v = std::getenv(layout::kEnvFd);
  if (v == nullptr || *v == '\0') return nullptr;
  const std::string text = v;
  int fd = -1;
  if (!absl::SimpleAtoi(text, &fd) || fd < 0) return BadBlock(text, "not a descriptor number");
  auto mapped = Map(fd, text);
  if (!mapped.ok()) return mapped.status();
  block = mapped->release();  // lives as long as the process
  return block;
}

void InplaceBlock::Register() {
  pid_->store(static_cast<std::uint32_t>(::getpid()), std::memory_order_release);
  flags_->fetch_or(layout::kFlagCanReform, std::memory_order_release);
}

void InplaceBlock::Ack(std::uint64_t generation) {
  ack_->store(generation, std::memory_order_release);
}

absl::StatusOr<InplaceBlock::Round> InplaceBlock::WaitReady(
    std::chrono::steady_clock::duration timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const std::uint64_t g = generation();
    if (state() == layout::kReady && g > worker_ack()) {
      const std::uint32_t n = env_bytes_->load(std::memory_order_acquire);
      const std::uint64_t round = round_->load(std::memory_order_acquire);
      std::string blob(base_ + layout::kEnvOffset,
                       std::min<std::uint64_t>(n, layout::kEnvCapacity));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (generation() == g && state() == layout::kReady) {
        auto env = ParseEnvBlob(blob.data(), blob.size());
        if (!env.ok()) return env.status();
        return Round{g, round, *std::move(env)};
      }
      continue;  // a newer break came in while copying
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no new round from the agent within ", std::chrono::duration<double>(timeout).count(),
          " s (generation ", g, ", state ", state(), ", this worker re-formed into generation ",
          worker_ack(), "); the agent restarts this worker as a process; raise ",
          layout::kEnvReadyTimeout, " if re-forming takes longer"));
    }
    std::this_thread::sleep_for(kReadyPoll);
  }
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseEnvBlob(const char* data,
                                                                              std::size_t bytes) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t i = 0;
  while (i < bytes) {
    const char* start = data + i;
    const std::size_t len = strnlen(start, bytes - i);
    const std::string entry(start, len);
    i += len + 1;
    if (entry.empty()) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the in-place control block's environment has a bad entry '", entry,
                       "' (KEY=VALUE expected): the agent's blob is corrupt"));
    }
    out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return out;
}

}  // namespace ddp::detail
