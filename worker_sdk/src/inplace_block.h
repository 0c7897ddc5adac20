// The worker's side of the in-place control block (inplace_layout.h,
// docs/recovery.md): the memfd the agent passes in DDPRUN_INPLACE_FD under
// --restart_policy=inplace. ddp::Init registers the process (worker_pid,
// kFlagCanReform); every group remembers the generation it was formed in
// and counts as broken once the agent's generation is past it (a blocked
// collective polls that one atomic and fails fast); ddp::Reconfigure waits
// for the new round (state kReady, generation > ack), reads its
// environment and, once the new group is formed, acknowledges it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp::detail {

class InplaceBlock {
 public:
  // The process's block, mapped on first use; null when DDPRUN_INPLACE_FD is
  // unset (not under --restart_policy=inplace). A set but unusable variable
  // (not a descriptor, wrong magic or version) is an InvalidArgument error
  // naming it.
  static absl::StatusOr<InplaceBlock*> Get();
  // Maps the block at descriptor `fd` (Get's work; tests map their own).
  // `name` is what errors call the descriptor.
  static absl::StatusOr<std::unique_ptr<InplaceBlock>> Map(int fd, const std::string& name);
  ~InplaceBlock();
  InplaceBlock(const InplaceBlock&) = delete;
  InplaceBlock& operator=(const InplaceBlock&) = delete;

  // worker_pid = this process, then kFlagCanReform in worker_flags.
  void Register();
  // The agent's generation (acquire): how many times the group was broken.
  std::uint64_t generation() const { return generation_->load(std::memory_order_acquire); }
  const std::atomic<std::uint64_t>* generation_word() const { return generation_; }
  std::uint64_t worker_ack() const { return ack_->load(std::memory_order_acquire); }
  std::uint32_t state() const { return state_->load(std::memory_order_acquire); }

  struct Round {
    std::uint64_t generation = 0;
    std::uint64_t round = 0;
    std::vector<std::pair<std::string, std::string>> env;  // KEY, VALUE
  };
  // Waits (polling) until the agent published a round newer than worker_ack
  // (state kReady, generation > worker_ack), then returns a consistent copy
  // of it (re-read against the generation: a newer break restarts the wait).
  // DeadlineExceeded after `timeout`, naming what it waited for.
  absl::StatusOr<Round> WaitReady(std::chrono::steady_clock::duration timeout) const;
  // worker_ack = generation (release): this process re-formed into it.
  void Ack(std::uint64_t generation);

 private:
  explicit InplaceBlock(char* base);
  char* base_;
  std::atomic<std::uint64_t>* generation_;
  std::atomic<std::uint32_t>* state_;
  std::atomic<std::uint32_t>* flags_;
  std::atomic<std::uint64_t>* ack_;
  std::atomic<std::uint32_t>* pid_;
  std::atomic<std::uint32_t>* env_bytes_;
  std::atomic<std::uint64_t>* round_;
};

// Parses a KEY=VALUE\0KEY=VALUE\0... blob (inplace_layout.h). An entry
// without '=' or with an empty key is InvalidArgument.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseEnvBlob(const char* data,
                                                                              std::size_t bytes);

}  // namespace ddp::detail
