// The Reducer: bucketed gradient all-reduce that overlaps the backward pass,
// DDP's reducer without PyTorch.
//
// Contract (as in torch/csrc/distributed/c10d/reducer.hpp):
//  1. The trainer registers its gradient buffers once, in model (forward)
//     order, before the first step. Registering after it is a StateError.
//  2. Buckets are filled in reverse registration order (about the order
//     backward produces gradients), grouped by dtype and device. A bucket is
//     closed once it holds at least its cap: first_bucket_bytes for the
//     first bucket, bucket_cap_bytes for the rest (it may exceed the cap by
//     one tensor).
//  3. The backward pass calls MarkReady(i) when gradient i is final. When
//     every gradient of a bucket is ready the bucket is packed (or used in
//     place as a view) and its all-reduce is launched. Buckets are launched
//     strictly in bucket order, so every rank issues the same collectives.
//  4. Finish() waits for every bucket, averages (divides by the world size)
//     and unpacks into the registered buffers. Gradients never marked ready
//     are launched by Finish (they are treated as ready).
//  5. At the first step every rank exchanges the (count, dtype) list of its
//     registered gradients; a mismatch is an InvalidArgumentError naming the
//     first differing tensor on every rank, not a hang.
//
// Not thread-safe: MarkReady/Finish come from one thread (the backward pass);
// the communication itself runs on the group's communication thread/stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddp {

inline constexpr std::size_t kDefaultBucketBytesCap = 25 * 1024 * 1024;
inline constexpr std::size_t kDefaultFirstBucketBytes = 1024 * 1024;

enum class Compression : int {
  kNone = 0,
  kFloat16 = 1,   // float32 gradients travel as float16 (pre-divided by the world size)
  kBFloat16 = 2,  // float32 gradients travel as bfloat16
};

struct ReducerOptions {
  std::size_t bucket_cap_bytes = kDefaultBucketBytesCap;
  std::size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  // Gradients live inside the flat buckets: the trainer writes gradient i
  // into GradientBuffer(i) instead of its own buffer; no pack/unpack copies.
  bool gradient_as_bucket_view = false;
  Compression compression = Compression::kNone;
  // Divide by the world size in Finish() (DDP's default). False: plain sum.
  bool average = true;
};

// One registered gradient: `count` elements of `dtype` at `data`.
struct GradSpec {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  Device device = {};
};

// Host-side timing of one bucket in the last synchronised step
// (Reducer::last_step_stats), steady clock. Taking it costs three clock
// reads per bucket and step.
struct BucketStats {
  std::size_t count = 0;       // elements
  std::size_t wire_bytes = 0;  // bytes all-reduced (halves with compression)
  // From the bucket becoming ready (the MarkReady of its last gradient, or
  // Finish for gradients never marked) to its collective having been issued
  // (the backend's Allreduce returned). Buckets launch in bucket order, so
  // this includes waiting for an earlier bucket that was not ready yet.
  std::chrono::nanoseconds ready_to_launch{0};
  // The launch itself: packing copies, compression, the enqueue.
  std::chrono::nanoseconds issue{0};
};

// Bucket assignment, exposed for tests: returns bucket -> gradient indices.
// Buckets come in launch order; indices within a bucket in reverse
// registration order.
std::vector<std::vector<std::size_t>> ComputeBucketAssignment(
    const std::vector<GradSpec>& grads, std::size_t first_bucket_bytes,
    std::size_t bucket_cap_bytes);

class ReducerImpl;

class Reducer {
 public:
  Reducer(std::shared_ptr<ProcessGroup> group, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Registers the next gradient (model order); returns its index.
  std::size_t Register(void* data, std::size_t count, DType dtype, Device device = {});
  template <class T>
  std::size_t Register(std::span<T> grad) {
    return Register(grad.data(), grad.size(), DTypeOf<T>());
  }

  // With gradient_as_bucket_view: where gradient i must be written (builds
  // the buckets on first use; the registered buffer's contents are copied in).
  // Without it: the registered pointer.
  void* GradientBuffer(std::size_t index);

  // Gradient `index` is final for this step.
  void MarkReady(std::size_t index);
  // Waits for every bucket, averages and unpacks. Within a no-sync scope it
  // only resets the step (gradients keep accumulating in the trainer's buffers).
  void Finish();

  // Gradient accumulation: while a NoSync guard lives, MarkReady/Finish do
  // no communication. The first step after it synchronises the accumulated
  // gradients, like DDP's no_sync().
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& r_;
    bool previous_;
  };
  NoSyncGuard NoSync() { return NoSyncGuard(*this); }
  void SetRequireSync(bool require_sync);

  std::size_t num_buckets() const;
  // The assignment in use (valid after the first step or GradientBuffer()).
  std::vector<std::vector<std::size_t>> bucket_assignment() const;
  std::size_t num_steps() const;
  // One entry per bucket (bucket order) for the last step that communicated;
  // empty before it. See BucketStats.
  std::vector<BucketStats> last_step_stats() const;

 private:
  std::unique_ptr<ReducerImpl> impl_;
};

// Copies rank 0's values of every buffer to all ranks (DDP's initial
// parameter sync), coalesced into chunks of up to 250 MiB per dtype.
void BroadcastParameters(ProcessGroup& group, const std::vector<GradSpec>& params, int root = 0);

}  // namespace ddp
