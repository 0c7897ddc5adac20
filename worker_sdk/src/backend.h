// The communicator interface behind ddp::ProcessGroup. Backends return
// absl::Status; ProcessGroup and Reducer convert at the public boundary.
//
// Contract for implementations:
//  - Collectives are asynchronous, executed in issue order, and return a
//    WorkState. Argument checks happen at issue time (InvalidArgument).
//  - The first failure aborts the group (Fail): every later call and every
//    pending WorkState returns FailedPrecondition naming that first failure.
//  - Messages start with Fence() and name the operation.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "copy_span.h"
#include "ddp/process_group.h"
#include "ddp/types.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "elementwise.h"

namespace ddp::detail {

// "[job <id> round <n> rank <r>] ", the prefix of every message about a rank
// of a group (ddp/error.h).
std::string FenceOf(const WorkerInfo& info);

class WorkState {
 public:
  virtual ~WorkState() = default;
  // Ok once the operation completed; DeadlineExceeded (after aborting the
  // group) when it did not within timeout; its error otherwise.
  virtual absl::Status Wait(Duration timeout) = 0;
  virtual absl::StatusOr<bool> IsCompleted() = 0;
  // Orders `stream` after the operation (GPU); host wait on CPU.
  virtual absl::Status Synchronize(void* stream) = 0;
  // Wait() with the group's timeout plus a margin, so that the backend's own
  // timeout (which knows more) normally reports first.
  virtual absl::Status WaitDefault() { return Wait(kDefaultTimeout * 2); }
};

// An already finished operation (zero-size collectives, world size 1).
class DoneWork final : public WorkState {
 public:
  explicit DoneWork(absl::Status s = absl::OkStatus()) : status_(std::move(s)) {}
  absl::Status Wait(Duration) override { return status_; }
  absl::StatusOr<bool> IsCompleted() override {
    if (!status_.ok()) return status_;
    return true;
  }
  absl::Status Synchronize(void*) override { return status_; }

 private:
  absl::Status status_;
};

using WorkPtr = std::shared_ptr<WorkState>;

class Backend {
 public:
  Backend(WorkerInfo info, Duration timeout) : info_(std::move(info)), timeout_(timeout) {}
  virtual ~Backend() = default;

  virtual ddp::Backend kind() const = 0;
  virtual absl::StatusOr<WorkPtr> Allreduce(void* data, std::size_t count, DType dtype,
                                            ReduceOp op) = 0;
  virtual absl::StatusOr<WorkPtr> Broadcast(void* data, std::size_t count, DType dtype,
                                            int root) = 0;
  virtual absl::StatusOr<WorkPtr> Allgather(const void* in, void* out, std::size_t count,
                                            DType dtype) = 0;
  virtual absl::StatusOr<WorkPtr> ReduceScatter(const void* in, void* out, std::size_t count,
                                                DType dtype, ReduceOp op) = 0;
  virtual absl::StatusOr<WorkPtr> Barrier() = 0;

  // An all-reduce of several buffers of one dtype taken as one concatenated
  // buffer, without packing them first (the Reducer's copy-mode buckets).
  // Only where SupportsAllreducePieces(); the same bits as Allreduce of the
  // packed buffer.
  struct Piece {
    void* data;
    std::size_t count;
  };
  virtual bool SupportsAllreducePieces() const { return false; }
  virtual absl::StatusOr<WorkPtr> AllreducePieces(std::vector<Piece> pieces, DType dtype,
                                                  ReduceOp op) {
    return absl::UnimplementedError(Fence() + "allreduce of pieces: not on this backend");
  }
  virtual void SetStream(void* stream) {}

  // Memory the collectives accept (host memory for Gloo, device memory for
  // NCCL), for the Reducer's flat buckets. Copy is ordered before later
  // collectives (NCCL: on the caller's stream).
  virtual absl::StatusOr<void*> Alloc(std::size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::Status Copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Several Copy calls at once (the Reducer's packing and unpacking of a
  // bucket); the copies must not overlap one another. `device_pointers`:
  // every pointer is device memory, which lets NCCL copy them all in one
  // kernel launch; otherwise (and on the CPU backends) one Copy each.
  virtual absl::Status CopyMany(const std::vector<CopySpan>& ops, bool device_pointers) {
    for (const CopySpan& op : ops) {
      absl::Status s = Copy(op.dst, op.src, op.bytes);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  virtual bool device_memory() const { return false; }
  // Waits for the copies issued by Copy (NCCL: synchronises the caller's stream).
  virtual absl::Status SyncCopies() { return absl::OkStatus(); }
  // The Reducer's f32 <-> f16/bf16 conversion of bucket memory, ordered
  // like Copy: dst[i] = wire(src[i] * scale), and dst[i] = float(src[i]).
  // Here for host memory (elementwise.h); device-memory backends (NCCL)
  // override them with kernels on the caller's stream.
  virtual absl::Status CompressF32(const float* src, void* dst, std::size_t n, DType wire,
                                   float scale) {
    CompressFloat32(src, static_cast<std::uint16_t*>(dst), n, wire, scale);
    return absl::OkStatus();
  }
  virtual absl::Status DecompressF32(const void* src, float* dst, std::size_t n, DType wire) {
    DecompressFloat32(static_cast<const std::uint16_t*>(src), dst, n, wire);
    return absl::OkStatus();
  }

  // Aborts the group with `reason` (the first reason wins). Thread-safe.
  // Every failed collective of every backend comes here: the sdk debug
  // channel's one line per failure.
  // `lost_rank`: the failure is a peer that is gone (its job rank, -1 when
  // unknown: the agent broke the group); OnAbort then fails the collective
  // in progress at once with a PeerLost status instead of letting it wait.
  void Fail(const std::string& reason, std::optional<int> lost_rank = std::nullopt) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      lost_rank_ = lost_rank;
      aborted_.store(true);
    }
    DDPRUN_DEBUG_LOG(kSdk) << Fence() << "group aborted: " << reason;
    OnAbort();
  }
  bool aborted() const { return aborted_.load(); }
  // The first failure's reason (empty while the group runs).
  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_reason_;
  }
  // The lost peer of the abort (see Fail); nullopt for other failures.
  std::optional<int> lost_rank() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lost_rank_;
  }

  // Under --restart_policy=inplace (inplace_block.h): the group was formed in
  // generation `formed` of the agent's control block; once *generation is
  // past it, the agent has broken the group and collectives in progress fail
  // fast with a PeerLost status. `generation` outlives the backend. Called
  // once, after the group is formed.
  virtual void WatchBreaks(const std::atomic<std::uint64_t>* generation, std::uint64_t formed) {}
  // Releases what the group holds that can go now (connections, segments,
  // communicators) after an abort, for ddp::Reconfigure; the rest goes with
  // the last reference. Default: nothing beyond the abort.
  virtual void Teardown() {}
  // FailedPrecondition naming the first failure, for calls after an abort.
  absl::Status AbortedStatus(const std::string& op) const {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::FailedPreconditionError(
        Fence() + op + ": the communicator was aborted (" + abort_reason_ +
        (lost_rank_ ? "); under --restart_policy=inplace call ddp::Reconfigure for the new "
                      "round's group, else exit so that ddprun restarts the job"
                    : "); exit so that ddprun restarts the job"));
  }

  const WorkerInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int size() const { return info_.world_size; }
  Duration timeout() const { return timeout_; }
  std::string Fence() const { return FenceOf(info_); }

 protected:
  // Backend-specific teardown of in-flight work (NCCL: ncclCommAbort).
  virtual void OnAbort() {}

 private:
  WorkerInfo info_;
  Duration timeout_;
  mutable std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  std::optional<int> lost_rank_;
};

// Argument checks shared by the backends.
absl::Status CheckBuffer(const Backend& b, const char* op, const void* p, std::size_t count,
                         DType dtype, const char* name = "data");
absl::Status CheckReduceOp(const Backend& b, const char* op, ReduceOp r);

// One collective as monitoring and error messages name it: its op, payload
// per rank and reduction. The strings are literals (op names, ReduceOpName),
// so a copy may outlive the call. Text() is "op(count x dtype[, extra])", or
// the op alone for a collective without payload (barrier).
struct OpDesc {
  const char* op;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  const char* extra = "";
  bool payload = true;

  static OpDesc Bare(const char* op) { return OpDesc{op, 0, DType::kFloat32, "", false}; }
  std::string Text() const;
  std::int64_t bytes() const {
    return payload ? static_cast<std::int64_t>(count * DTypeSize(dtype)) : 0;
  }
};

}  // namespace ddp::detail

namespace ddprun::rendezvous {
class Store;
}

namespace ddp::detail {
absl::StatusOr<std::shared_ptr<Backend>> CreateGlooBackend(
    const WorkerInfo& info, const InitOptions& options,
    std::shared_ptr<ddprun::rendezvous::Store> store, const std::string& key_prefix);
absl::StatusOr<std::shared_ptr<Backend>> CreateNcclBackend(
    const WorkerInfo& info, const InitOptions& options,
    std::shared_ptr<ddprun::rendezvous::Store> store, const std::string& key_prefix);
bool NcclCompiledIn();
int CudaDeviceCount();
}  // namespace ddp::detail
