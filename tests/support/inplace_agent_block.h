// The agent's side of the in-place control block (inplace_layout.h), for
// tests that play the agent: a memfd (inherited by spawned workers: no
// close-on-exec) written by the protocol's steps 1, 3 and 4.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/common/inplace_layout.h"

namespace ddprun::test {

namespace layout = ddprun::inplace_layout;

// A block as the agent creates it: magic, version, generation 0, running.
// Not copyable (it owns the descriptor).
class AgentBlock {
 public:
  AgentBlock() {
    fd_ = ::memfd_create("inplace-test", 0);
    REQUIRE(fd_ >= 0);
    REQUIRE(::ftruncate(fd_, layout::kBlockBytes) == 0);
    base_ = static_cast<char*>(
        ::mmap(nullptr, layout::kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    REQUIRE(base_ != MAP_FAILED);
    std::memcpy(base_ + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic);
    Put<std::uint32_t>(layout::kVersionOffset, layout::kVersion);
    Put<std::uint32_t>(layout::kBlockBytesOffset, layout::kBlockBytes);
  }
  ~AgentBlock() {
    ::munmap(base_, layout::kBlockBytes);
    ::close(fd_);
  }
  int fd() const { return fd_; }
  template <class T>
  std::atomic<T>& At(std::uint64_t offset) {
    return *reinterpret_cast<std::atomic<T>*>(base_ + offset);
  }
  template <class T>
  void Put(std::uint64_t offset, T v) {
    At<T>(offset).store(v, std::memory_order_release);
  }
  AgentBlock(const AgentBlock&) = delete;
  AgentBlock& operator=(const AgentBlock&) = delete;
  // "DDPRUN_INPLACE_FD=<fd>", for the worker's environment.
  std::pair<std::string, std::string> EnvEntry() const {
    return {layout::kEnvFd, std::to_string(fd_)};
  }
  // Steps 3 and 4 of the protocol: break, then publish `env` as round `round`.
  void Break() {
    Put<std::uint32_t>(layout::kStateOffset, layout::kBroken);
    At<std::uint64_t>(layout::kGenerationOffset).fetch_add(1, std::memory_order_release);
  }
  // `env` as the blob: KEY=VALUE entries, each ended by '\0'.
  void Publish(const std::vector<std::pair<std::string, std::string>>& env, std::uint64_t round) {
    std::string blob;
    for (const auto& [k, v] : env) blob += k + "=" + v + std::string(1, '\0');
    Publish(blob, round);
  }
  void Publish(const std::string& env, std::uint64_t round) {
    std::memcpy(base_ + layout::kEnvOffset, env.data(), env.size());
    Put<std::uint32_t>(layout::kEnvBytesOffset, static_cast<std::uint32_t>(env.size()));
    Put<std::uint64_t>(layout::kRoundOffset, round);
    Put<std::uint32_t>(layout::kStateOffset, layout::kReady);
  }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
};

}  // namespace ddprun::test
