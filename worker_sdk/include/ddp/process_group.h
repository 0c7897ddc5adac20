// ddp::Init and the ProcessGroup: the communicator of one rendezvous round.
//
// A worker started by ddprun calls ddp::Init() once. Init reads the
// environment ddprun sets (RANK, WORLD_SIZE, LOCAL_RANK, DDPRUN_STORE_ADDR,
// DDPRUN_JOB_ID, DDPRUN_ROUND, DDPRUN_TOKEN, DDPRUN_HOST), connects to the
// job's gRPC store with the job's token, and bootstraps a backend through
// keys of this round only (a restarted job never reads a stale id):
//
//   NCCL (GPU workers, built with CUDA): rank 0 publishes the ncclUniqueId
//        under "ddp/pg<N>/nccl/unique_id"; the others wait for it. The
//        communicator is nonblocking; collectives run on a dedicated
//        high-priority stream ordered against the caller's stream with events.
//   Gloo (CPU workers): gloo's full-mesh rendezvous over the same store, with
//        its TCP transport on DDPRUN_HOST.
//
// Every collective is asynchronous and returns a Work handle. Collectives run
// in the order they were issued, and every rank must issue the same ones in
// the same order (as with NCCL and Gloo). A failed or timed-out collective
// aborts the group: the error names the operation, the round and the peer
// when known, and every later call throws StateError. A peer that is gone
// is a PeerLostError at once (no timeout wait). The worker should then exit
// non-zero so that the agent restarts the job, or, under
// --restart_policy=inplace, call Reconfigure for the new round's group.
//
// Thread-safety: a ProcessGroup may be shared between threads; calls that
// issue collectives are serialised internally.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "ddp/error.h"
#include "ddp/types.h"

namespace ddp {

namespace detail {
class Backend;
class WorkState;
}  // namespace detail

inline constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

// A handle on one asynchronous collective. Copyable; a default-constructed
// Work is already complete.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the collective is done (on GPU: until its kernel finished).
  // Throws ddp::Error on failure, and TimeoutError (aborting the group) when
  // it is not done after `timeout` (default: the group's timeout).
  void Wait();
  void Wait(Duration timeout);
  // Non-blocking; throws the collective's error if it failed.
  bool IsCompleted() const;
  // GPU only: makes `stream` (a cudaStream_t) wait for the collective without
  // blocking the host. On CPU it is Wait().
  void Synchronize(void* stream);

 private:
  std::shared_ptr<detail::WorkState> state_;
};

struct InitOptions {
  Backend backend = Backend::kAuto;  // DDP_BACKEND=gloo|nccl overrides kAuto
  // Bootstrap and per-collective timeout. DDP_TIMEOUT_SEC overrides the default.
  Duration timeout = kDefaultTimeout;
  // The address Gloo's TCP transport binds; empty = DDPRUN_HOST.
  std::string gloo_host;
  // CPU groups whose ranks all run on one host use a shared memory segment
  // instead of TCP loopback (memfd; falls back to TCP, with one line on
  // stderr, when it cannot be set up). DDP_SHM=0 turns it off.
  bool shared_memory = true;
};

// What Init read from the environment.
struct WorkerInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string job_id;
  std::int64_t round = 0;
  std::string host;
  std::string store_addr;
};

template <class T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::kInt64;
  else
    static_assert(sizeof(T) == 0, "use the (void*, count, DType) overload for this type");
}

class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  Backend backend() const;
  Duration timeout() const;
  const WorkerInfo& info() const;
  // "[job <id> round <n> rank <r>] ", the prefix of every error message.
  std::string Fence() const;

  // In place: data holds `count` elements on every rank.
  Work Allreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  // In place: root's `count` elements are copied to every rank.
  Work Broadcast(void* data, std::size_t count, DType dtype, int root = 0);
  // `in` holds `count` elements; `out` receives size()*count, rank-major.
  Work Allgather(const void* in, void* out, std::size_t count, DType dtype);
  // `in` holds size()*count elements; `out` receives this rank's reduced block of `count`.
  Work ReduceScatter(const void* in, void* out, std::size_t count, DType dtype,
                     ReduceOp op = ReduceOp::kSum);
  Work Barrier();

  template <class T>
  Work Allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    return Allreduce(data.data(), data.size(), DTypeOf<T>(), op);
  }
  template <class T>
  Work Broadcast(std::span<T> data, int root = 0) {
    return Broadcast(data.data(), data.size(), DTypeOf<T>(), root);
  }

  // Memory for collective buffers that this group reduces fastest, like
  // NCCL's ncclMemAlloc: on a CPU group whose ranks share a host, memory the
  // host's other ranks can map, so that a large all-reduce on it folds every
  // rank's buffer in place (no staging copies: about 2x the bandwidth of the
  // same call on ordinary heap memory; docs/sdk.md); device memory on NCCL;
  // ordinary host memory otherwise. Zero-filled on CPU, page-aligned there,
  // at least `bytes`. Any buffer works with every collective; this one is
  // just faster. Free it with FreeMemory, before the group is destroyed.
  // Throws when the memory cannot be had.
  void* AllocMemory(std::size_t bytes);
  void FreeMemory(void* p);

  // GPU only: the caller's stream (a cudaStream_t); collectives issued after
  // this wait for the work queued on it. Default: the legacy default stream.
  void SetStream(void* stream);

  // Makes the group unusable (NCCL: ncclCommAbort). Later calls throw
  // StateError naming `reason`. Idempotent.
  void Abort(const std::string& reason);
  bool aborted() const;

  // Internal: the backend, for the Reducer and the C API.
  detail::Backend& backend_impl() const { return *backend_; }
  explicit ProcessGroup(std::shared_ptr<detail::Backend> backend);

 private:
  std::shared_ptr<detail::Backend> backend_;
};

// Reads ddprun's environment and bootstraps the communicator of this round.
// Throws InvalidArgumentError (naming the variable and showing how to run
// under ddprun) when the environment is missing or garbled, AuthError on a
// wrong token, TimeoutError when peers do not arrive within the timeout.
std::shared_ptr<ProcessGroup> Init(const InitOptions& options = {});

// Under --restart_policy=inplace (docs/sdk.md, "Re-forming in place"): after
// a collective threw PeerLostError (or any failure that aborted `broken`),
// gives this process the new round's group without restarting it. It aborts
// `broken` and releases the caller's reference (Reducers and Work handles of
// the old group must go too: their calls throw StateError), waits for the
// agent to publish the new round in the control block (at most
// DDPRUN_INPLACE_READY_TIMEOUT seconds, default 300: TimeoutError), takes
// that round's environment (RANK, WORLD_SIZE, DDPRUN_ROUND, the store, ...)
// into the process environment, forms the group the way Init does, and tells
// the agent it did. Every survivor and the replacement (which calls Init)
// meet in the new group. Without the control block (not under
// --restart_policy=inplace) it throws StateError saying so. `broken` may be
// null.
std::shared_ptr<ProcessGroup> Reconfigure(std::shared_ptr<ProcessGroup> broken,
                                          const InitOptions& options = {});

// Parses the environment only (no connection). Throws like Init.
WorkerInfo ReadWorkerEnvironment();

// True when this build has NCCL and a CUDA device is visible.
bool CudaAvailable();

}  // namespace ddp
