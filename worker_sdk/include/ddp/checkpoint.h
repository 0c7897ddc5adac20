// Checkpoints in memory owned by ddprun's agent, for C++ trainers
// (docs/checkpoint.md, "C++ and C"): the same memory, format and agreement
// as Python's ddprun.checkpoint, over named byte spans.
//
//   std::vector<float> weights(n);
//   std::int64_t start = 0;
//   if (auto snap = ddp::checkpoint::Load()) {           // nullopt: a fresh start
//     const auto& w = snap->Get("weights");
//     std::memcpy(weights.data(), w.data(), w.size());
//     start = snap->step + 1;
//   }
//   for (std::int64_t step = start; step < steps; ++step) {
//     ... train ...
//     ddp::checkpoint::Save(step, {{"weights", weights.data(), weights.size() * 4}});
//   }
//
// Save returns once the bytes are committed in the agent's memory for this
// worker (DDPRUN_CKPT_FD): they survive the worker's death, and the worker
// that replaces it finds them. The previous snapshot is not touched while
// the new one is written. With --ckpt_replicas 1, Save returns once the next
// node also holds the replica of this rank's previous step (sent while this
// step computed; at most DDPRUN_CKPT_REPLICA_WAIT seconds; docs/checkpoint.md,
// "Replica lag"). Load returns the newest
// step that every rank of the job committed, the same step on every rank; every rank must call it,
// at start, before its first Save. A snapshot saved here loads in Python as
// a dict of `bytes`, and a Python snapshot whose top level is a dict of
// tensors, arrays or bytes loads here as their raw bytes.
//
// Errors are ddp::Error (ddp/error.h): InvalidArgumentError for bad spans
// (empty or duplicate name, null data, a snapshot over --ckpt_shm_limit) and
// a Python snapshot this API cannot read; StateError when the worker has no
// checkpoint memory or the snapshot is gone or corrupt (InvalidArgumentError
// also for a DDPRUN_CKPT_REPLICA_WAIT that is not seconds >= 0); TimeoutError or
// ConnectionError when the nodes cannot agree on a step. Not thread-safe:
// call it from one thread of the worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::checkpoint {

// A named byte range to save: `size` bytes at `data`, which must stay valid
// until Save returns. Names are 1 or more bytes of UTF-8, unique per Save.
struct Span {
  std::string name;
  const void* data = nullptr;  // may be null only when size is 0
  std::size_t size = 0;
};

// One named buffer of a loaded snapshot, in the order it was saved.
struct Buffer {
  std::string name;
  std::vector<std::byte> bytes;

  const void* data() const { return bytes.data(); }
  std::size_t size() const { return bytes.size(); }
};

struct Snapshot {
  std::int64_t step = 0;
  std::vector<Buffer> buffers;

  // The buffer named `name`, or nullptr.
  const Buffer* Find(const std::string& name) const;
  // The buffer named `name`; InvalidArgumentError naming the saved names if
  // there is none.
  const Buffer& Get(const std::string& name) const;
};

// Copies the spans into this worker's checkpoint memory as `step` and
// returns once the copy is committed (see above). Under --ckpt_every N, a
// step that is not a multiple of N returns at once without saving.
void Save(std::int64_t step, const std::vector<Span>& spans);

// The newest step every rank of the job committed and its buffers, or
// nullopt when there is none (a fresh start, or a job whose shape changed).
std::optional<Snapshot> Load();

// Waits for outstanding background work of Save. This version has none
// (Save copies before it returns), so it returns at once.
void Wait();

}  // namespace ddp::checkpoint
