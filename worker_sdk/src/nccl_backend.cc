// The NCCL backend (GPU workers). Built only with DDPRUN_WITH_CUDA.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and publishes the 128 bytes under
// "<group prefix>nccl/unique_id" in this round's store scope; the others wait
// for the key (a restarted job is a new round, so a stale id is never read).
// The communicator is nonblocking (ncclConfig_t.blocking = 0): init and every
// collective may return ncclInProgress, and ncclCommGetAsyncError is polled
// against a deadline. On a failure or a timeout the group calls ncclCommAbort.
//
// Streams: collectives run on a dedicated stream of the highest priority.
// Before each one, an event recorded on the caller's stream (SetStream,
// default the legacy stream) is waited on; after it, an event is recorded
// that Work::Wait polls and Work::Synchronize makes another stream wait on.
// Zero-element collectives are not sent to NCCL: they are done at once.
//
// Monitoring (docs/monitoring-sources.md): under ddprun every collective is
// recorded in the metrics channel like the CPU backends' (op, bytes,
// sequence number, duration, bus bandwidth). Its start is recorded when it
// is enqueued, its end once an event recorded after it on the collective
// stream has completed, found by cudaEventQuery without blocking: at the
// next launch, and in Work::Wait / IsCompleted once they see the work done.
// Durations are sampled (duration_sampler.h says why and how): a timed
// collective has timing events around the NCCL call (device time, so it
// includes waiting for the peers, as the CPU paths' does); the others a plain
// end event, and the last measured duration of their op and size class.
//
// NCCL is loaded at run time (nccl_loader.h): every NCCL call goes through the
// process's NcclApi table, loaded before the first device check; a missing
// NCCL is one error of CreateNcclBackend. The CUDA runtime is linked
// statically and private to the SDK (worker_sdk/CMakeLists.txt).
//
// Compression (the Reducer's f16/bf16 buckets): CompressF32/DecompressF32
// launch the kernels of cuda_kernels.cu on the caller's stream, like Copy, so
// they are ordered after the trainer's work and before the next collective.
#include "absl/strings/str_cat.h"
#include "backend.h"
#include "status.h"
#include "ddprun/rendezvous/store/store.h"
#include "metrics.h"

#if DDPRUN_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "cuda_kernels.h"
#include "duration_sampler.h"
#include "nccl_loader.h"
#endif

namespace ddp::detail {

#if !DDPRUN_WITH_CUDA

bool NcclCompiledIn() { return false; }
int CudaDeviceCount() { return 0; }
absl::StatusOr<std::shared_ptr<Backend>> CreateNcclBackend(
    const WorkerInfo& info, const InitOptions&, std::shared_ptr<ddprun::rendezvous::Store>,
    const std::string&) {
  return absl::UnimplementedError("this build has no CUDA/NCCL");
}

#else

namespace {

using SteadyClock = std::chrono::steady_clock;

std::string CudaErr(cudaError_t e) { return absl::StrCat(cudaGetErrorString(e), " (", e, ")"); }
std::string NcclErr(const NcclApi& nccl, ncclResult_t r) {
  return absl::StrCat(nccl.ncclGetErrorString(r), " (", r, ")");
}

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

class NcclBackend;

class NcclWork final : public WorkState {
 public:
  NcclWork(std::weak_ptr<NcclBackend> owner, std::string desc, cudaEvent_t done,
           Duration default_timeout)
      : owner_(std::move(owner)),
        desc_(std::move(desc)),
        done_(done),
        default_timeout_(default_timeout) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  absl::Status Wait(Duration timeout) override;
  absl::StatusOr<bool> IsCompleted() override;
  absl::Status Synchronize(void* stream) override {
    cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0);
    if (e != cudaSuccess) {
      return absl::InternalError(absl::StrCat(desc_, ": cudaStreamWaitEvent: ", CudaErr(e)));
    }
    return absl::OkStatus();
  }
  absl::Status WaitDefault() override { return Wait(default_timeout_); }

 private:
  std::weak_ptr<NcclBackend> owner_;
  std::string desc_;
  cudaEvent_t done_;
  Duration default_timeout_;
};

class NcclBackend final : public Backend, public std::enable_shared_from_this<NcclBackend> {
 public:
  NcclBackend(WorkerInfo info, Duration timeout, int device, const NcclApi& nccl)
      : Backend(std::move(info), timeout), device_(device), nccl_(nccl) {}

  ~NcclBackend() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (aborted()) {
        // Already aborted in OnAbort.
      } else {
        // Flush, then destroy; a finalize that does not finish becomes an abort.
        ncclResult_t r = nccl_.ncclCommFinalize(comm_);
        if (r == ncclSuccess || r == ncclInProgress) r = PollAsync(timeout());
        if (r == ncclSuccess)
          nccl_.ncclCommDestroy(comm_);
        else
          nccl_.ncclCommAbort(comm_);
      }
    }
    for (const InFlight& f : in_flight_) {
      if (f.start != nullptr) cudaEventDestroy(f.start);
      if (f.end != nullptr) cudaEventDestroy(f.end);
    }
    for (cudaEvent_t e : spare_timing_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_plain_events_) cudaEventDestroy(e);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Bootstrap(std::shared_ptr<ddprun::rendezvous::Store> store,
                         const std::string& prefix) {
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return Cuda("cudaSetDevice", e);
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    e = cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest);
    if (e != cudaSuccess) return Cuda("cudaStreamCreateWithPriority", e);
    e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
    if (e != cudaSuccess) return Cuda("cudaEventCreate", e);
    e = cudaMalloc(&scratch_, 64);
    if (e != cudaSuccess) return Cuda("cudaMalloc", e);

    const std::string key = prefix + "nccl/unique_id";
    ncclUniqueId id;
    if (rank() == 0) {
      ncclResult_t r = nccl_.ncclGetUniqueId(&id);
      if (r != ncclSuccess) return Nccl("ncclGetUniqueId", r);
      DDPRUN_RETURN_IF_ERROR(store->Set(key, std::string(id.internal, sizeof(id.internal))));
    } else {
      auto v = store->Get(key, timeout());
      if (!v.ok()) {
        return absl::Status(
            v.status().code(),
            absl::StrCat(Fence(),
                         "nccl bootstrap: waiting for rank 0's unique id: ", v.status().message()));
      }
      if (v->size() != sizeof(id.internal)) {
        return absl::InternalError(absl::StrCat(Fence(), "nccl bootstrap: the unique id has ",
                                                v->size(), " bytes, expected ",
                                                sizeof(id.internal)));
      }
      std::memcpy(id.internal, v->data(), sizeof(id.internal));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = nccl_.ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) return Nccl("ncclCommInitRankConfig", r);
    r = PollAsync(timeout());
    if (r == ncclInProgress) {
      nccl_.ncclCommAbort(comm_);
      comm_ = nullptr;
      return absl::DeadlineExceededError(
          absl::StrCat(Fence(), "nccl bootstrap: ncclCommInitRankConfig did not finish within ",
                       timeout().count() / 1000.0, " s (a peer did not arrive); aborted"));
    }
    if (r != ncclSuccess) {
      nccl_.ncclCommAbort(comm_);
      comm_ = nullptr;
      return Nccl("ncclCommInitRankConfig", r);
    }
    return absl::OkStatus();
  }

  ddp::Backend kind() const override { return ddp::Backend::kNccl; }
  bool device_memory() const override { return true; }
  void SetStream(void* stream) override { user_stream_ = static_cast<cudaStream_t>(stream); }

  absl::StatusOr<WorkPtr> Allreduce(void* data, std::size_t count, DType dtype,
                                    ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allreduce", data, count, dtype));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "allreduce", op));
    if (count == 0) return Done();
    return Launch(OpDesc{"allreduce", count, dtype, ReduceOpName(op)}, [&] {
      return nccl_.ncclAllReduce(data, data, count, NcclType(dtype), NcclOp(op), comm_, stream_);
    });
  }
  absl::StatusOr<WorkPtr> Broadcast(void* data, std::size_t count, DType dtype, int root) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "broadcast", data, count, dtype));
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Fence(), "broadcast: root ", root, " is not a rank (size ", size(), ")"));
    }
    if (count == 0) return Done();
    return Launch(OpDesc{"broadcast", count, dtype}, [&] {
      return nccl_.ncclBroadcast(data, data, count, NcclType(dtype), root, comm_, stream_);
    });
  }
  absl::StatusOr<WorkPtr> Allgather(const void* in, void* out, std::size_t count,
                                    DType dtype) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allgather", in, count, dtype, "input"));
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allgather", out, count, dtype, "output"));
    if (count == 0) return Done();
    return Launch(OpDesc{"allgather", count, dtype}, [&] {
      return nccl_.ncclAllGather(in, out, count, NcclType(dtype), comm_, stream_);
    });
  }
  absl::StatusOr<WorkPtr> ReduceScatter(const void* in, void* out, std::size_t count, DType dtype,
                                        ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", in, count, dtype, "input"));
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", out, count, dtype, "output"));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "reduce_scatter", op));
    if (count == 0) return Done();
    return Launch(OpDesc{"reduce_scatter", count, dtype, ReduceOpName(op)}, [&] {
      return nccl_.ncclReduceScatter(in, out, count, NcclType(dtype), NcclOp(op), comm_, stream_);
    });
  }
  absl::StatusOr<WorkPtr> Barrier() override {
    if (aborted()) return AbortedStatus("barrier");
    return Launch(OpDesc::Bare("barrier"), [&] {
      return nccl_.ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

  absl::StatusOr<void*> Alloc(std::size_t bytes) override {
    cudaSetDevice(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) return Cuda("cudaMalloc (buckets)", e);
    return p;
  }
  void Free(void* p) override { cudaFree(p); }
  absl::Status Copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, user_stream_);
    if (e != cudaSuccess) return Cuda("cudaMemcpyAsync", e);
    return absl::OkStatus();
  }

  absl::Status CopyMany(const std::vector<CopySpan>& ops, bool device_pointers) override {
    if (!device_pointers) return Backend::CopyMany(ops, false);
    const int e = cuda::LaunchCopyBatch(ops.data(), ops.size(), user_stream_);
    if (e != 0) return Cuda("copy kernel", static_cast<cudaError_t>(e));
    return absl::OkStatus();
  }

  absl::Status SyncCopies() override {
    cudaError_t e = cudaStreamSynchronize(user_stream_);
    if (e != cudaSuccess) return Cuda("cudaStreamSynchronize", e);
    return absl::OkStatus();
  }

  absl::Status CompressF32(const float* src, void* dst, std::size_t n, DType wire,
                           float scale) override {
    if (wire != DType::kFloat16 && wire != DType::kBFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat(Fence(), "compress: wire dtype ", DTypeName(wire), " is not f16/bf16"));
    }
    cudaSetDevice(device_);
    const int e =
        cuda::LaunchCompressF32(src, dst, n, wire == DType::kBFloat16, scale, user_stream_);
    if (e != 0) return Cuda("compress kernel (f32 -> half)", static_cast<cudaError_t>(e));
    return absl::OkStatus();
  }
  absl::Status DecompressF32(const void* src, float* dst, std::size_t n, DType wire) override {
    if (wire != DType::kFloat16 && wire != DType::kBFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat(Fence(), "decompress: wire dtype ", DTypeName(wire), " is not f16/bf16"));
    }
    cudaSetDevice(device_);
    const int e = cuda::LaunchDecompressF32(src, dst, n, wire == DType::kBFloat16, user_stream_);
    if (e != 0) return Cuda("decompress kernel (half -> f32)", static_cast<cudaError_t>(e));
    return absl::OkStatus();
  }

  // Polls ncclCommGetAsyncError until it is not ncclInProgress or timeout passes.
  ncclResult_t PollAsync(Duration timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    ncclResult_t state = ncclInProgress;
    for (;;) {
      ncclResult_t r = nccl_.ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return r;
      if (state != ncclInProgress) return state;
      if (SteadyClock::now() >= deadline) return ncclInProgress;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // The comm's asynchronous error (ncclSuccess or ncclInProgress = healthy).
  ncclResult_t AsyncError() {
    ncclResult_t state = ncclSuccess;
    if (nccl_.ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclInternalError;
    return state;
  }
  std::weak_ptr<NcclBackend> weak() { return weak_from_this(); }
  const NcclApi& nccl() const { return nccl_; }

  // Under --restart_policy=inplace: a wait polls the control block's
  // generation (one atomic) and fails fast once the agent broke the group.
  // NCCL does not see a dead peer on every transport (P2P and SHM kernels
  // just wait), so this is the GPU path's fail-fast signal.
  void WatchBreaks(const std::atomic<std::uint64_t>* generation, std::uint64_t formed) override {
    break_generation_ = generation;
    formed_generation_ = formed;
  }
  bool BrokenByAgent() const {
    return break_generation_ != nullptr &&
           break_generation_->load(std::memory_order_acquire) > formed_generation_;
  }

  // Records the end of every monitored collective whose end event has
  // completed (in issue order: one stream). Never blocks.
  void Reap() {
    std::lock_guard<std::mutex> lock(launch_mu_);
    ReapLocked();
  }

 protected:
  void OnAbort() override {
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (comm_ != nullptr) nccl_.ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  absl::Status Cuda(const char* what, cudaError_t e) const {
    return absl::InternalError(absl::StrCat(Fence(), what, ": ", CudaErr(e)));
  }
  absl::Status Nccl(const char* what, ncclResult_t r) const {
    return absl::UnavailableError(absl::StrCat(Fence(), what, ": ", NcclErr(nccl_, r)));
  }

  static absl::StatusOr<WorkPtr> Done() { return WorkPtr(std::make_shared<DoneWork>()); }

  // A monitored collective between its enqueue and the host seeing its end.
  struct InFlight {
    std::string op;
    std::int64_t bytes = 0;
    cudaEvent_t start = nullptr;  // a timing event before it on stream_; null: not timed
    cudaEvent_t end = nullptr;    // after it on stream_: a timing event when `start` is set
  };
  static constexpr std::size_t kMaxInFlight = 4096;  // beyond: recorded without a duration

  // An event from its spares, or a new one; null on a CUDA error.
  cudaEvent_t TakeEvent(bool timing) {
    std::vector<cudaEvent_t>& spares = timing ? spare_timing_events_ : spare_plain_events_;
    if (!spares.empty()) {
      cudaEvent_t e = spares.back();
      spares.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming) !=
        cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return e;
  }
  void GiveBack(const InFlight& f) {
    if (f.start != nullptr) spare_timing_events_.push_back(f.start);
    if (f.end != nullptr)
      (f.start != nullptr ? spare_timing_events_ : spare_plain_events_).push_back(f.end);
  }

  // A monitored collective's events, before its NCCL call: the timing pair,
  // its start recorded, when the sampler asks for a duration and CUDA obliges;
  // else a plain end event (null on a CUDA error: then no events at all).
  void TakeEventsLocked(InFlight* rec) {
    const auto now = SteadyClock::now();
    if (sampler_.ShouldTime(rec->op, rec->bytes, now)) {
      rec->start = TakeEvent(true);
      rec->end = rec->start ? TakeEvent(true) : nullptr;
      if (rec->end != nullptr && cudaEventRecord(rec->start, stream_) == cudaSuccess) {
        sampler_.Timed(now);
        return;
      }
      cudaGetLastError();
      GiveBack(*rec);
      rec->start = rec->end = nullptr;
    }
    rec->end = TakeEvent(false);
  }

  void ReapLocked() {
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      const cudaError_t q = cudaEventQuery(f.end);
      if (q == cudaErrorNotReady) return;
      double s = 0;  // an aborted communicator: no duration
      if (q != cudaSuccess) {
        cudaGetLastError();
      } else if (f.start != nullptr) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, f.start, f.end) == cudaSuccess) {
          s = ms / 1000.0;
          sampler_.Measured(f.op, f.bytes, s);
        } else {
          cudaGetLastError();
        }
      } else {
        s = sampler_.Estimate(f.op, f.bytes);
      }
      channel_->CollectiveEnd(f.op, f.bytes, s, BusBandwidthGbps(f.op.c_str(), f.bytes, s, size()),
                              in_flight_.size() > 1);
      GiveBack(f);
      in_flight_.pop_front();
    }
  }

  template <class Fn>
  absl::StatusOr<WorkPtr> Launch(const OpDesc& op, Fn&& call) {
    const std::string desc = op.Text();  // for errors and the Work
    std::lock_guard<std::mutex> lock(launch_mu_);
    if (aborted() || comm_ == nullptr) return AbortedStatus(desc);
    cudaSetDevice(device_);
    // Order after the caller's stream.
    cudaError_t e = cudaEventRecord(ready_, user_stream_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready_, 0);
    if (e != cudaSuccess) return Cuda("ordering against the caller's stream", e);
    InFlight rec;
    if (channel_ != nullptr) {
      ReapLocked();
      rec.op = op.op;
      rec.bytes = op.bytes();
      channel_->CollectiveStart(rec.op);
      if (in_flight_.size() < kMaxInFlight) TakeEventsLocked(&rec);
    }
    ncclResult_t r = call();
    if (r == ncclInProgress) r = PollAsync(timeout());
    if (r != ncclSuccess) {
      const std::string why =
          r == ncclInProgress ? "did not enqueue within the timeout" : NcclErr(nccl_, r);
      if (channel_ != nullptr) {  // never enqueued: ended, no duration
        GiveBack(rec);
        channel_->CollectiveEnd(rec.op, rec.bytes, 0, 0, !in_flight_.empty());
      }
      launch_mu_.unlock();
      Fail(absl::StrCat(desc, ": ", why));
      launch_mu_.lock();
      return absl::UnavailableError(absl::StrCat(Fence(), desc, " failed: ", why));
    }
    if (channel_ != nullptr) {
      if (rec.end != nullptr && cudaEventRecord(rec.end, stream_) == cudaSuccess) {
        in_flight_.push_back(std::move(rec));
      } else {
        // No events (a CUDA error or too many in flight): ended now, no duration.
        cudaGetLastError();
        GiveBack(rec);
        channel_->CollectiveEnd(rec.op, rec.bytes, 0, 0, !in_flight_.empty());
      }
    }
    cudaEvent_t done = nullptr;
    e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, stream_);
    if (e != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      return Cuda("cudaEventRecord", e);
    }
    return WorkPtr(std::make_shared<NcclWork>(weak_from_this(), desc, done, timeout()));
  }

  int device_;
  const NcclApi& nccl_;  // the process's (LoadNccl), never unloaded
  ncclComm_t comm_ = nullptr;
  const std::atomic<std::uint64_t>* break_generation_ = nullptr;
  std::uint64_t formed_generation_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t user_stream_ = nullptr;  // legacy default stream
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
  std::mutex launch_mu_;
  ddprun::rendezvous::ChannelWriter* const channel_ = MetricsChannel();  // null: not monitored
  std::deque<InFlight> in_flight_;                // under launch_mu_, issue order
  std::vector<cudaEvent_t> spare_timing_events_;  // under launch_mu_: timing
  std::vector<cudaEvent_t> spare_plain_events_;   // under launch_mu_: without timing
  DurationSampler sampler_;                       // under launch_mu_
};

absl::Status NcclWork::Wait(Duration timeout) {
  const auto start = SteadyClock::now();
  const auto deadline = start + timeout;
  // The first 200 us poll without sleeping: a 20 us sleep is 60-80 us on
  // Linux (timer slack), longer than a small collective on a GPU.
  const auto spin_until = start + std::chrono::microseconds(200);
  for (;;) {
    cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) {
      if (auto owner = owner_.lock()) owner->Reap();  // monitoring: the end is known now
      return absl::OkStatus();
    }
    auto owner = owner_.lock();
    if (e != cudaErrorNotReady) {
      if (owner) owner->Fail(absl::StrCat(desc_, ": ", CudaErr(e)));
      return absl::InternalError(
          absl::StrCat(owner ? owner->Fence() : "", desc_, ": ", CudaErr(e)));
    }
    if (owner) {
      if (owner->aborted()) return owner->AbortedStatus(desc_);
      if (owner->BrokenByAgent()) {
        const std::string why = "the agent reports this group broken (a peer failed)";
        owner->Fail(absl::StrCat(desc_, ": ", why), -1);  // ncclCommAbort
        return PeerLostStatus(absl::StrCat(owner->Fence(), desc_, " failed: ", why,
                                           "; ddp::Reconfigure gives the new round's group"),
                              -1);
      }
      ncclResult_t r = owner->AsyncError();
      if (r != ncclSuccess && r != ncclInProgress) {
        owner->Fail(absl::StrCat(desc_, ": ", NcclErr(owner->nccl(), r)));
        return absl::UnavailableError(absl::StrCat(
            owner->Fence(), desc_,
            " failed: a peer died or a link broke (nccl: ", NcclErr(owner->nccl(), r), ")"));
      }
    }
    if (SteadyClock::now() >= deadline) {
      const std::string what =
          absl::StrCat(desc_, " did not complete within ", timeout.count() / 1000.0, " s");
      if (owner) owner->Fail(what);  // ncclCommAbort
      return absl::DeadlineExceededError(
          absl::StrCat(owner ? owner->Fence() : "", what, "; the communicator was aborted"));
    }
    if (SteadyClock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

absl::StatusOr<bool> NcclWork::IsCompleted() {
  cudaError_t e = cudaEventQuery(done_);
  if (e == cudaSuccess) {
    if (auto owner = owner_.lock()) owner->Reap();
    return true;
  }
  if (e == cudaErrorNotReady) return false;
  return absl::InternalError(absl::StrCat(desc_, ": ", CudaErr(e)));
}

}  // namespace

bool NcclCompiledIn() { return true; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::shared_ptr<Backend>> CreateNcclBackend(
    const WorkerInfo& info, const InitOptions& options,
    std::shared_ptr<ddprun::rendezvous::Store> store, const std::string& prefix) {
  absl::StatusOr<const NcclApi*> nccl = LoadNccl();
  if (!nccl.ok()) {
    return absl::Status(nccl.status().code(), absl::StrCat(FenceOf(info), nccl.status().message()));
  }
  DDPRUN_DEBUG_LOG(kSdk) << FenceOf(info) << "NCCL " << NcclVersionText((*nccl)->version)
                         << " from " << (*nccl)->path;
  const int n = CudaDeviceCount();
  if (n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        FenceOf(info), "backend nccl: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"));
  }
  // LOCAL_RANK's device, or the only one CUDA_VISIBLE_DEVICES leaves.
  const int device = n == 1 ? 0 : info.local_rank % n;
  auto backend = std::make_shared<NcclBackend>(info, options.timeout, device, **nccl);
  DDPRUN_RETURN_IF_ERROR(backend->Bootstrap(std::move(store), prefix));
  return std::shared_ptr<Backend>(backend);
}

#endif  // DDPRUN_WITH_CUDA

}  // namespace ddp::detail
