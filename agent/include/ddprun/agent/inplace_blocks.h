// The agent's side of the in-place control blocks (--restart_policy=inplace,
// docs/recovery.md, layout and protocol in inplace_layout.h): one small memfd
// per local rank, created and owned by the agent, mapped here and handed to
// each worker of that rank as an inherited descriptor (DDPRUN_INPLACE_FD).
// A block outlives the worker process; it is freed with the agent.
//
// The agent breaks a survivor's group (state kBroken, generation + 1) as soon
// as it knows of a failure, publishes the new round's environment (kReady)
// once the round is formed, and reads whether the worker registered and
// acknowledged. Every field is one aligned atomic load or store on the shared
// mapping. Not thread-safe: the agent's main thread owns it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ddprun::agent {

struct SpawnSpec;

class InplaceBlocks {
 public:
  InplaceBlocks() = default;
  ~InplaceBlocks();
  InplaceBlocks(const InplaceBlocks&) = delete;
  InplaceBlocks& operator=(const InplaceBlocks&) = delete;

  // Creates the blocks of local ranks [0, local_ranks) not created yet. An
  // error names the rank and the cause.
  absl::Status Ensure(int local_ranks);
  int size() const { return static_cast<int>(blocks_.size()); }

  // A fresh process of local rank j is about to start: the block says
  // running, unregistered, acknowledged up to the current generation
  // (inplace_layout.h, step 1); DDPRUN_INPLACE_FD and the descriptor go
  // into the spawn.
  void AddToSpawn(int local_rank, SpawnSpec* spec);
  // Whether the process `pid` registered as able to re-form in place.
  bool Registered(int local_rank, pid_t pid) const;
  // Breaks local rank j's group: state kBroken, then generation + 1. A
  // second break before the publish only bumps the generation.
  void Break(int local_rank);
  // Whether local rank j is broken and waits for a publish.
  bool Broken(int local_rank) const;
  // Writes the new round's variables (KEY=VALUE\0...) and `round`, then
  // kReady. An error when they do not fit the block (the caller restarts
  // the worker as a process instead).
  absl::Status Publish(int local_rank, const std::map<std::string, std::string>& vars,
                       std::int64_t round);
  // The worker acknowledged the current generation (re-formed into it).
  bool Acked(int local_rank) const;
  // After the ack: state kRunning again (inplace_layout.h, step 6).
  void SetRunning(int local_rank);
  std::uint64_t generation(int local_rank) const;

 private:
  struct Block {
    int fd = -1;
    unsigned char* base = nullptr;  // the shared mapping of kBlockBytes
  };
  std::vector<Block> blocks_;
};

// Outside --restart_policy=inplace: DDPRUN_INPLACE_FD is erased, never
// inherited from the agent's environment.
void RemoveInplaceEnv(std::map<std::string, std::string>* env);

// The variables of `next` that a worker started with `current` must take:
// those added or changed (a variable ddprun no longer sets stays as it is).
std::map<std::string, std::string> ChangedVariables(
    const std::map<std::string, std::string>& current,
    const std::map<std::string, std::string>& next);

}  // namespace ddprun::agent
