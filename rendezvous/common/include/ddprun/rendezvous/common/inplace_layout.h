// The in-place control block (docs/recovery.md, "The control block"): the
// contract between the agent, which creates one per local rank under
// --restart_policy=inplace and writes the round's side of it, and the
// worker side, which registers and acknowledges: ddprun.inprocess
// (worker_sdk/python/ddprun/inprocess.py) and the SDK's ddp::Init and
// ddp::Reconfigure. Standard library only: the SDK includes it, Python reads
// the same offsets with struct. Every integer little-endian.
//
// The block is a memfd of kBlockBytes, created by the agent and passed to
// the worker as the descriptor number in DDPRUN_INPLACE_FD (not close-on-exec
// in the child). It outlives the worker process and is freed with the agent.
//
//   [0, kHeaderBytes)             the fields below
//   [kEnvOffset, kBlockBytes)     the new round's environment: env_bytes bytes
//                                 of KEY=VALUE\0KEY=VALUE\0...
//
// Who writes what. The agent writes magic, version, generation, state,
// env_bytes, round and the blob; the worker writes worker_flags, worker_pid
// and worker_ack. Nobody else writes a field, so each u32/u64 field is one
// aligned store and a reader sees either the old or the new value.
//
// The protocol, one generation at a time:
//   1. Spawn. Before it starts a process in this local rank, the agent sets
//      state = kRunning, worker_flags = 0, worker_pid = 0 and
//      worker_ack = generation: a fresh process is in the current round.
//   2. Register. A worker that can re-form in its own process stores its pid
//      in worker_pid, then sets kFlagCanReform in worker_flags. A process
//      whose worker_pid is not its own pid never registered (the agent
//      compares it with the pid it started).
//   3. Break. When the group is broken (a peer failed, the round is being
//      re-formed), the agent stores state = kBroken and then increments
//      generation (release). The group a worker re-formed into (its
//      worker_ack) is broken when state is kBroken or generation >
//      worker_ack: polling state alone (one atomic load) is enough to fail a
//      blocked collective fast.
//   4. Publish. Once the new round is formed, the agent writes the blob,
//      env_bytes and round, then stores state = kReady (release).
//   5. Re-form. A worker reads generation g (acquire), then state; if state is
//      kReady and g > worker_ack it copies the blob, reads generation again,
//      and uses the copy only if generation is still g and state is still
//      kReady (otherwise a newer break came in: wait again). It applies the
//      blob to its environment, forms the new group, then stores
//      worker_ack = g (release).
//   6. Ack. Once worker_ack reaches the generation the agent stores
//      state = kRunning again. A survivor whose worker_ack does not reach
//      the generation within the agent's deadline is restarted as a process.
// A worker that has not registered (worker_flags bit 0 clear) when its group
// breaks is restarted as a process; the agent says why on the console.
#pragma once

#include <cstdint>

namespace ddprun::inplace_layout {

inline constexpr char kMagic[8] = {'D', 'D', 'P', 'I', 'N', 'P', 'L', '1'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint64_t kHeaderBytes = 64;
inline constexpr std::uint64_t kBlockBytes = 64 * 1024;
inline constexpr std::uint64_t kEnvOffset = kHeaderBytes;
inline constexpr std::uint64_t kEnvCapacity = kBlockBytes - kEnvOffset;

// Header fields (byte offsets). A: the agent writes it; W: the worker does.
inline constexpr std::uint64_t kMagicOffset = 0;         // A char[8]
inline constexpr std::uint64_t kVersionOffset = 8;       // A u32
inline constexpr std::uint64_t kBlockBytesOffset = 12;   // A u32: kBlockBytes
inline constexpr std::uint64_t kGenerationOffset = 16;   // A u64: breaks so far
inline constexpr std::uint64_t kStateOffset = 24;        // A u32: a State
inline constexpr std::uint64_t kWorkerFlagsOffset = 28;  // W u32: Flag bits
inline constexpr std::uint64_t kWorkerAckOffset = 32;    // W u64: generation re-formed into
inline constexpr std::uint64_t kWorkerPidOffset = 40;    // W u32: the registering process
inline constexpr std::uint64_t kEnvBytesOffset = 44;     // A u32: bytes of the blob
inline constexpr std::uint64_t kRoundOffset = 48;        // A u64: the blob's round

enum State : std::uint32_t { kRunning = 0, kBroken = 1, kReady = 2 };

enum Flag : std::uint32_t { kFlagCanReform = 1u << 0 };

// The descriptor number of the block in the worker (set only under
// --restart_policy=inplace).
inline constexpr const char* kEnvFd = "DDPRUN_INPLACE_FD";

// How long a worker waits for kReady after it saw kBroken before it gives
// up and exits (the agent then restarts it as a process). Read by the
// worker side only; seconds.
inline constexpr const char* kEnvReadyTimeout = "DDPRUN_INPLACE_READY_TIMEOUT";
inline constexpr double kDefaultReadyTimeoutSeconds = 300;

}  // namespace ddprun::inplace_layout
