// The CPU backend (ddp::Backend::kGloo): collectives over Gloo's TCP
// transport and shared memory, bootstrapped through our store.
//
// Collectives are queued to one communication thread per group and run there
// in issue order, so the caller (the backward pass) goes on while they run.
// Gloo has no abort: a failed or timed-out group is marked aborted, queued
// work is failed, and the thread finishes the operation it is in when Gloo's
// own timeout (the group timeout) fires. Everything the thread touches lives
// in a Core it shares, so a group destroyed while its thread is stuck in Gloo
// leaves the thread to finish on its own.
//
// Small all-reduces (the latency-bound ones) run on a second Gloo context whose
// pairs are in sync mode: the communication thread reads and writes its
// sockets itself. On the default (async) context every receive goes through
// Gloo's device loop thread, which spins on epoll while our thread holds the
// pair lock (Pair::handleEvents only try-locks); on a 2-core machine a spinner
// that preempts the lock holder burns a whole scheduler slice, and those calls
// took 4 ms instead of 0.3 ms (docs/benchmarks.md, worker SDK).
//
// The CPU backend: shared memory between the ranks of a host (shm_group.h)
// and Gloo's TCP transport between hosts. Init learns which ranks share a
// host, then:
//   one host            every collective through shared memory; no Gloo mesh
//                       (memcpy bandwidth instead of TCP loopback);
//   several hosts, some all-reduces hierarchical: the host's sum in shared
//   with several ranks  memory, an all-reduce of the hosts' sums among the
//                       hosts' first ranks (their own Gloo mesh, sync-mode at
//                       two hosts), a shared memory broadcast back; the other
//                       collectives on a Gloo mesh of all ranks;
//   one rank per host   Gloo only.
// DDP_SHM=0 (InitOptions::shared_memory) opts out of shared memory.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend.h"
#include "ddprun/rendezvous/store.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "elementwise.h"
#include "half.h"
#include "shm_group.h"

namespace ddp::detail {
namespace {

namespace rdzv = ddprun::rendezvous;

// gloo::rendezvous::Store over our Store, under a key prefix of this round.
// Gloo expects exceptions; the first error is kept for Init to report.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<rdzv::Store> base, std::string prefix, Duration timeout)
      : base_(std::move(base)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(base_->Set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = base_->Get(prefix_ + key, timeout_);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    Check(base_->Wait(full, std::min<Duration>(t, timeout_)));
  }

  const absl::Status& error() const { return error_; }

 private:
  void Check(const absl::Status& s) {
    if (s.ok()) return;
    if (error_.ok()) error_ = s;
    throw gloo::IoException(std::string(s.message()));
  }
  std::shared_ptr<rdzv::Store> base_;
  std::string prefix_;
  Duration timeout_;
  absl::Status error_;
};

// In-place reductions for Gloo's bound-buffer algorithms: x = op(x, y).
template <class T, class Op>
void ReduceInPlace(T* x, const T* y, std::size_t n) {
  Op op;
  for (std::size_t i = 0; i < n; ++i) x[i] = op(x[i], y[i]);
}

template <float (*ToF)(std::uint16_t), std::uint16_t (*FromF)(float), class Op>
void ReduceHalfInPlace(std::uint16_t* x, const std::uint16_t* y, std::size_t n) {
  Op op;
  for (std::size_t i = 0; i < n; ++i) x[i] = FromF(op(ToF(x[i]), ToF(y[i])));
}

struct Plus {
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> T operator()(T a, T b) const { return a < b ? b : a; }
};
struct Min {
  template <class T> T operator()(T a, T b) const { return b < a ? b : a; }
};

// A ReductionFunction for the sync path, one static per (type, op).
template <class T, void (*Fn)(T*, const T*, std::size_t)>
const gloo::ReductionFunction<T>* SyncFn() {
  static const gloo::ReductionFunction<T> f(gloo::CUSTOM, Fn);
  return &f;
}

// Gloo's bound-buffer rings, for the sync-mode context. Two ranks:
// AllreduceRing, which sends the whole buffer once each way (a + b == b + a,
// so both ranks get the same bits). More: AllreduceRingChunked, a
// reduce-scatter then an allgather around the ring, so each chunk is summed
// once, in one order, and every rank receives the same bits (AllreduceRing
// would have each rank add in its own order and replicas drift apart).
template <class T>
void RunRingOf(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
               const gloo::ReductionFunction<T>* fn) {
  if (ctx->size == 2) {
    gloo::AllreduceRing<T> ring(ctx, {static_cast<T*>(data)}, static_cast<int>(count), fn);
    ring.run();
  } else {
    gloo::AllreduceRingChunked<T> ring(ctx, {static_cast<T*>(data)}, static_cast<int>(count),
                                       fn);
    ring.run();
  }
}

template <class T, class Op>
void RunSyncRing(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count) {
  RunRingOf<T>(ctx, data, count, SyncFn<T, &ReduceInPlace<T, Op>>());
}

template <class Op>
void RunSyncHalfRing(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
                     bool bf16) {
  using U = std::uint16_t;
  const gloo::ReductionFunction<U>* fn =
      bf16 ? SyncFn<U, &ReduceHalfInPlace<BFloat16ToFloat, FloatToBFloat16, Op>>()
           : SyncFn<U, &ReduceHalfInPlace<Float16ToFloat, FloatToFloat16, Op>>();
  RunRingOf<U>(ctx, data, count, fn);
}

template <class Op>
void RunSyncAllreduceOp(const std::shared_ptr<gloo::Context>& ctx, void* data,
                        std::size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return RunSyncRing<float, Op>(ctx, data, count);
    case DType::kFloat64: return RunSyncRing<double, Op>(ctx, data, count);
    case DType::kInt32: return RunSyncRing<std::int32_t, Op>(ctx, data, count);
    case DType::kInt64: return RunSyncRing<std::int64_t, Op>(ctx, data, count);
    case DType::kFloat16: return RunSyncHalfRing<Op>(ctx, data, count, false);
    case DType::kBFloat16: return RunSyncHalfRing<Op>(ctx, data, count, true);
  }
}

// All-reduce on the sync context (Gloo's rings over bound buffers; a blocking
// write per message, which suits small messages only).
void RunSyncAllreduce(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
                      DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return RunSyncAllreduceOp<Plus>(ctx, data, count, dtype);
    case ReduceOp::kMax: return RunSyncAllreduceOp<Max>(ctx, data, count, dtype);
    case ReduceOp::kMin: return RunSyncAllreduceOp<Min>(ctx, data, count, dtype);
  }
}

// Gloo's option setters are templates on the element type; only its size matters.
template <class Fn>
void WithElementType(DType dtype, Fn&& fn) {
  switch (DTypeSize(dtype)) {
    case 2: fn(std::uint16_t{}); break;
    case 4: fn(std::uint32_t{}); break;
    case 8: fn(std::uint64_t{}); break;
  }
}

// A failed shared-memory collective, thrown inside a task like Gloo's
// exceptions and turned into its Status by the communication thread.
struct ShmFailure {
  absl::Status status;
};

void ThrowIfFailed(absl::Status s) {
  if (!s.ok()) throw ShmFailure{std::move(s)};
}

ShmGroup::Clock::time_point DeadlineIn(Duration t) { return ShmGroup::Clock::now() + t; }

class Core;

// net.core.wmem_max, the most SO_SNDBUF a process may ask for (Linux's
// default when it cannot be read).
std::size_t WmemMax() {
  std::size_t v = 212992;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
    unsigned long long x = 0;
    if (std::fscanf(f, "%llu", &x) == 1 && x > 0) v = static_cast<std::size_t>(x);
    std::fclose(f);
  }
  return v;
}

// One queued collective and its completion.
class GlooWork final : public WorkState {
 public:
  GlooWork(std::weak_ptr<Backend> owner, std::string desc, Duration default_timeout)
      : owner_(std::move(owner)), desc_(std::move(desc)), default_timeout_(default_timeout) {}

  void Complete(absl::Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      status_ = std::move(s);
    }
    cv_.notify_all();
  }

  absl::Status Wait(Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, timeout, [&] { return done_; })) return status_;
    lock.unlock();
    const std::string what =
        absl::StrCat(desc_, " did not complete within ", timeout.count() / 1000.0, " s");
    std::string fence;
    if (auto b = owner_.lock()) {
      b->Fail(what);
      fence = b->Fence();
    }
    return absl::DeadlineExceededError(
        absl::StrCat(fence, what, " (a peer is slow, hung or issued a different collective)"));
  }
  absl::StatusOr<bool> IsCompleted() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && !status_.ok()) return status_;
    return done_;
  }
  absl::Status Synchronize(void*) override { return WaitDefault(); }
  absl::Status WaitDefault() override { return Wait(default_timeout_ + std::chrono::seconds(5)); }

 private:
  std::weak_ptr<Backend> owner_;
  std::string desc_;
  Duration default_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

struct Task {
  std::string desc;
  std::function<void()> run;  // may throw gloo exceptions
  std::shared_ptr<GlooWork> work;
};

// State shared by the group and its communication thread.
class Core {
 public:
  std::shared_ptr<gloo::rendezvous::Context> context;
  // Pairs in sync mode, for small all-reduces (see the top of this file);
  // null for a group of one.
  std::shared_ptr<gloo::rendezvous::Context> sync_context;
  std::size_t sync_max_bytes = 0;  // net.core.wmem_max
  std::shared_ptr<gloo::transport::Device> device;
  // The ranks of this host, when some host has more than one. With one host
  // every collective uses it and there are no Gloo contexts; with several,
  // all-reduces are hierarchical: shm, then the leaders' contexts (set on
  // each host's first rank only), then an shm broadcast.
  std::unique_ptr<ShmGroup> shm;
  bool leader = false;
  std::shared_ptr<gloo::rendezvous::Context> leaders;
  std::shared_ptr<gloo::rendezvous::Context> leaders_sync;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool stop = false;
  bool busy = false;
  // Reused scratch for reduce-scatter (first-touch page faults are slow).
  std::vector<char> scratch;
};

class GlooBackend final : public Backend, public std::enable_shared_from_this<GlooBackend> {
 public:
  GlooBackend(WorkerInfo info, Duration timeout, std::shared_ptr<Core> core)
      : Backend(std::move(info), timeout), core_(std::move(core)) {}

  ~GlooBackend() override {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->stop = true;
      busy = core_->busy;
    }
    core_->cv.notify_all();
    // A thread stuck in Gloo on an aborted group finishes on its own.
    if (busy && aborted()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

  void Start() {
    thread_ = std::thread([core = core_, weak = weak_from_this()] { Loop(core, weak); });
  }

  ddp::Backend kind() const override { return ddp::Backend::kGloo; }

  absl::StatusOr<WorkPtr> Allreduce(void* data, std::size_t count, DType dtype,
                                    ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allreduce", data, count, dtype));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "allreduce", op));
    const std::string desc = DescribeOp("allreduce", count, dtype, ReduceOpName(op));
    if (count == 0) return Enqueue(desc, nullptr);
    const int n = size();
    if (n == 1) {
      return Enqueue(desc, [=] { if (op == ReduceOp::kAvg) DivideInPlace(data, count, dtype, 1); });
    }
    const Duration t = timeout();
    if (ShmGroup* one_host = OneHostShm()) {
      return Enqueue(desc, [=] {
        ThrowIfFailed(one_host->Allreduce(data, count, dtype, op, DeadlineIn(t)));
      });
    }
    ShmGroup* shm = core_->shm.get();
    const std::size_t bytes = count * DTypeSize(dtype);
    if (shm) {
      // Hierarchical: the host's sum (every rank of a host gets the same
      // bits), the leaders' all-reduce of the hosts' sums (Gloo gives every
      // leader the same bits), then the leader's result to its host.
      const ReduceOp partial = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
      return Enqueue(desc, [=, core = core_.get(), tag = NextTag()] {
        const auto deadline = DeadlineIn(t);
        if (shm->size() > 1) ThrowIfFailed(shm->Allreduce(data, count, dtype, partial, deadline));
        if (core->leader) {
          TcpAllreduce(core->leaders, core->leaders_sync, core->sync_max_bytes, data, count, dtype,
                       partial, tag, t);
        }
        if (shm->size() > 1) ThrowIfFailed(shm->Broadcast(data, bytes, 0, deadline));
        if (op == ReduceOp::kAvg) DivideInPlace(data, count, dtype, n);
      });
    }
    return Enqueue(desc, [=, core = core_.get(), tag = NextTag()] {
      TcpAllreduce(core->context, core->sync_context, core->sync_max_bytes, data, count, dtype,
                   op, tag, t);
      if (op == ReduceOp::kAvg) DivideInPlace(data, count, dtype, n);
    });
  }

  bool SupportsAllreducePieces() const override { return OneHostShm() != nullptr; }

  absl::StatusOr<WorkPtr> AllreducePieces(std::vector<Piece> pieces, DType dtype,
                                          ReduceOp op) override {
    ShmGroup* shm = OneHostShm();
    if (shm == nullptr) return Backend::AllreducePieces(std::move(pieces), dtype, op);
    std::size_t count = 0;
    std::vector<ShmPiece> shm_pieces;
    for (const Piece& p : pieces) {
      DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allreduce", p.data, p.count, dtype));
      count += p.count;
      if (p.count) shm_pieces.push_back(ShmPiece{p.data, p.count * DTypeSize(dtype)});
    }
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "allreduce", op));
    const std::string desc = DescribeOp("allreduce", count, dtype, ReduceOpName(op));
    if (count == 0) return Enqueue(desc, nullptr);
    return Enqueue(desc, [=, t = timeout()] {
      ThrowIfFailed(shm->Allreduce(shm_pieces, dtype, op, DeadlineIn(t)));
    });
  }

  absl::StatusOr<WorkPtr> Broadcast(void* data, std::size_t count, DType dtype,
                                    int root) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "broadcast", data, count, dtype));
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(Fence(), "broadcast: root ", root,
                                                     " is not a rank of this group (size ",
                                                     size(), ")"));
    }
    const std::string desc = DescribeOp("broadcast", count, dtype, "");
    if (count == 0 || size() == 1) return Enqueue(desc, nullptr);
    const Duration t = timeout();
    if (ShmGroup* shm = OneHostShm()) {
      return Enqueue(desc, [=] {
        ThrowIfFailed(shm->Broadcast(data, count * DTypeSize(dtype), root, DeadlineIn(t)));
      });
    }
    return Enqueue(desc, [=, ctx = core_->context, tag = NextTag()] {
      gloo::BroadcastOptions opts(ctx);
      WithElementType(dtype, [&](auto e) {
        opts.setOutput(static_cast<decltype(e)*>(data), count);
      });
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(t);
      gloo::broadcast(opts);
    });
  }

  absl::StatusOr<WorkPtr> Allgather(const void* in, void* out, std::size_t count,
                                    DType dtype) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allgather", in, count, dtype, "input"));
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allgather", out, count, dtype, "output"));
    const std::string desc = DescribeOp("allgather", count, dtype, "");
    if (count == 0) return Enqueue(desc, nullptr);
    const std::size_t bytes = count * DTypeSize(dtype);
    if (size() == 1) {
      return Enqueue(desc, [=] { if (out != in) std::memmove(out, in, bytes); });
    }
    const Duration t = timeout();
    const std::size_t n = size();
    if (ShmGroup* shm = OneHostShm()) {
      return Enqueue(desc, [=] { ThrowIfFailed(shm->Allgather(in, out, bytes, DeadlineIn(t))); });
    }
    return Enqueue(desc, [=, ctx = core_->context, tag = NextTag()] {
      gloo::AllgatherOptions opts(ctx);
      WithElementType(dtype, [&](auto e) {
        using E = decltype(e);
        opts.setInput(const_cast<E*>(static_cast<const E*>(in)), count);
        opts.setOutput(static_cast<E*>(out), count * n);
      });
      opts.setTag(tag);
      opts.setTimeout(t);
      gloo::allgather(opts);
    });
  }

  // Gloo 0.5's new API has no reduce-scatter: all-reduce a copy in a reused
  // scratch buffer, then keep this rank's block.
  absl::StatusOr<WorkPtr> ReduceScatter(const void* in, void* out, std::size_t count,
                                        DType dtype, ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", in, count, dtype, "input"));
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", out, count, dtype, "output"));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "reduce_scatter", op));
    const std::string desc = DescribeOp("reduce_scatter", count, dtype, ReduceOpName(op));
    if (count == 0) return Enqueue(desc, nullptr);
    const std::size_t esize = DTypeSize(dtype);
    const int n = size();
    const int r = rank();
    auto func = ReduceFunc(dtype, op);
    const Duration t = timeout();
    return Enqueue(desc, [=, core = core_.get(), one_host = OneHostShm(), tag = NextTag()] {
      const std::size_t total = count * esize * n;
      if (core->scratch.size() < total) core->scratch.resize(total);
      char* s = core->scratch.data();
      std::memcpy(s, in, total);
      if (n > 1 && one_host) {
        ThrowIfFailed(one_host->Allreduce(s, count * n, dtype, op, DeadlineIn(t)));
      } else if (n > 1) {
        gloo::AllreduceOptions opts(core->context);
        WithElementType(dtype, [&](auto e) {
          opts.setOutput(reinterpret_cast<decltype(e)*>(s), count * n);
        });
        opts.setReduceFunction(func);
        opts.setTag(tag);
        opts.setTimeout(t);
        gloo::allreduce(opts);
      }
      std::memcpy(out, s + r * count * esize, count * esize);
      if (op == ReduceOp::kAvg && !one_host) DivideInPlace(out, count, dtype, n);
    });
  }

  absl::StatusOr<WorkPtr> Barrier() override {
    if (aborted()) return AbortedStatus("barrier");
    if (size() == 1) return Enqueue("barrier", nullptr);
    const Duration t = timeout();
    if (ShmGroup* shm = OneHostShm()) {
      return Enqueue("barrier", [=] { ThrowIfFailed(shm->Barrier(DeadlineIn(t))); });
    }
    return Enqueue("barrier", [=, ctx = core_->context, tag = NextTag()] {
      gloo::BarrierOptions opts(ctx);
      opts.setTag(tag);
      opts.setTimeout(t);
      gloo::barrier(opts);
    });
  }

  absl::StatusOr<void*> Alloc(std::size_t bytes) override {
    void* p = nullptr;
    if (::posix_memalign(&p, 64, std::max<std::size_t>(bytes, 64)) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(Fence(), "out of memory for ", bytes,
                                                       " bytes of buckets"));
    }
    // Touch every page now: first-touch page faults are slow on VMs.
    std::memset(p, 0, bytes);
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::Status Copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

 protected:
  void OnAbort() override {
    // Wakes a shared-memory collective in progress (and tells the peers).
    if (core_->shm) core_->shm->Abort();
    // Fail what is queued; what runs finishes or times out inside Gloo.
    std::deque<Task> dropped;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      dropped.swap(core_->queue);
    }
    for (Task& t : dropped) t.work->Complete(AbortedStatus(t.desc));
  }

 private:
  std::uint32_t NextTag() { return tag_++; }
  // The shared memory group when every rank is on this host (then there is
  // no Gloo context and every collective uses it).
  ShmGroup* OneHostShm() const { return core_->context ? nullptr : core_->shm.get(); }

  // The sync rings (RunRingOf) are worth it while latency dominates. Their
  // writes block, and every rank writes before it reads, so a message must
  // fit in the socket's send buffer or the ranks deadlock: Gloo sizes
  // SO_SNDBUF to the message, which the kernel caps at net.core.wmem_max (and
  // then doubles). Above that, the async context. Measured here (p50 of back
  // to back calls, TCP loopback): at 2 ranks the sync ring wins up to 4 MiB;
  // at 3-4 ranks the chunked one wins 3-5x up to 256 KiB (0.46-1.1 ms
  // against 1.5-5.4 ms) but loses at 1 MiB at 4 ranks (8.0 against 4.9 ms).
  static std::size_t SyncAllreduceMaxBytes(std::size_t wmem_max, int ranks) {
    const std::size_t cap = ranks == 2 ? std::size_t(4) << 20 : std::size_t(256) << 10;
    return std::min(cap, wmem_max);
  }

  // An all-reduce (kAvg not divided) over a Gloo context: on its sync-mode
  // twin when there is one and the message is small. Throws Gloo's exceptions.
  static void TcpAllreduce(const std::shared_ptr<gloo::rendezvous::Context>& ctx,
                           const std::shared_ptr<gloo::rendezvous::Context>& sync_ctx,
                           std::size_t wmem_max, void* data, std::size_t count, DType dtype,
                           ReduceOp op, std::uint32_t tag, Duration timeout) {
    if (ctx->size == 1) return;
    if (sync_ctx && count * DTypeSize(dtype) <= SyncAllreduceMaxBytes(wmem_max, ctx->size)) {
      RunSyncAllreduce(sync_ctx, data, count, dtype, op);
      return;
    }
    gloo::AllreduceOptions opts(ctx);
    WithElementType(dtype,
                    [&](auto e) { opts.setOutput(static_cast<decltype(e)*>(data), count); });
    opts.setReduceFunction(ReduceFunc(dtype, op));
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  }

  absl::StatusOr<WorkPtr> Enqueue(const std::string& desc, std::function<void()> run) {
    if (aborted()) return AbortedStatus(desc);
    auto work = std::make_shared<GlooWork>(weak_from_this(), desc, timeout());
    if (!run) {
      // Nothing to communicate, but keep issue order: completes after earlier work.
      run = [] {};
    }
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->queue.push_back(Task{desc, std::move(run), work});
    }
    core_->cv.notify_one();
    return work;
  }

  static void Loop(std::shared_ptr<Core> core, std::weak_ptr<GlooBackend> weak) {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(core->mu);
        core->cv.wait(lock, [&] { return core->stop || !core->queue.empty(); });
        if (core->queue.empty()) return;  // stop requested and nothing left
        task = std::move(core->queue.front());
        core->queue.pop_front();
        core->busy = true;
      }
      absl::Status status;
      try {
        task.run();
      } catch (const ShmFailure& f) {
        status = ClassifyShm(task.desc, f.status, weak);
      } catch (const std::exception& e) {
        status = Classify(task.desc, e.what(), weak);
      }
      {
        std::lock_guard<std::mutex> lock(core->mu);
        core->busy = false;
      }
      task.work->Complete(std::move(status));
    }
  }

  // A Gloo exception as a Status: timeouts are DeadlineExceeded, everything
  // else (a closed connection: a dead peer) Unavailable. Aborts the group.
  static absl::Status Classify(const std::string& desc, const std::string& what,
                               const std::weak_ptr<GlooBackend>& weak) {
    std::string fence;
    auto self = weak.lock();
    if (self) fence = self->Fence();
    if (self) self->Fail(absl::StrCat(desc, ": ", what));
    // A peer sent more than this rank's buffer holds: Gloo's size check.
    if (what.find("op.buf->size_") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          fence, desc, " failed: a peer issued a collective of another size (every rank must ",
          "issue the same collectives with the same sizes, in the same order; gloo: ", what, ")"));
    }
    const bool timed_out = what.find("imed out") != std::string::npos ||
                           what.find("imeout") != std::string::npos;
    std::string msg = absl::StrCat(fence, desc, timed_out ? " timed out" : " failed",
                                   ": a peer died, hung or left the job (gloo: ", what, ")");
    return timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  }

  // A failed shared-memory collective (its message names the peer): fenced,
  // and the group aborted.
  static absl::Status ClassifyShm(const std::string& desc, const absl::Status& s,
                                  const std::weak_ptr<GlooBackend>& weak) {
    std::string fence;
    auto self = weak.lock();
    if (self) {
      fence = self->Fence();
      self->Fail(absl::StrCat(desc, ": ", s.message()));
    }
    return absl::Status(s.code(), absl::StrCat(fence, desc, " failed (shared memory): ",
                                               s.message()));
  }

  std::shared_ptr<Core> core_;
  std::thread thread_;
  std::uint32_t tag_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> CreateGlooBackend(const WorkerInfo& info,
                                                           const InitOptions& options,
                                                           std::shared_ptr<rdzv::Store> store,
                                                           const std::string& key_prefix) {
  auto core = std::make_shared<Core>();
  const std::string host = options.gloo_host.empty() ? info.host : options.gloo_host;
  const std::string fence =
      absl::StrCat("[job ", info.job_id, " round ", info.round, " rank ", info.rank, "] ");
  // Which ranks share a host decides the path (see the top of this file).
  HostLayout layout;
  bool max_local_above_one = false;
  if (options.shared_memory && info.world_size > 1) {
    auto l = ExchangeHostLayout(info, *store, key_prefix, options.timeout);
    if (!l.ok()) {
      return absl::Status(l.status().code(), absl::StrCat(fence, "host layout through the store: ",
                                                          l.status().message()));
    }
    layout = *l;
    max_local_above_one = layout.num_hosts < info.world_size;
  }
  if (max_local_above_one) {
    std::string why;
    auto shm = ConnectShmGroup(layout, info, *store, key_prefix, options.timeout,
                               kDefaultShmChunkBytes, &why);
    if (!shm.ok()) {
      return absl::Status(shm.status().code(),
                          absl::StrCat(fence, "shared memory bootstrap through the store: ",
                                       shm.status().message()));
    }
    if (*shm) {
      core->shm = std::move(*shm);
      if (layout.num_hosts == 1) {
        auto backend = std::make_shared<GlooBackend>(info, options.timeout, core);
        backend->Start();
        return std::shared_ptr<Backend>(backend);
      }
    } else if (info.rank == 0) {
      std::fprintf(stderr,
                   "%sddp: no shared memory between the ranks of a host (%s); "
                   "collectives go over Gloo's TCP transport\n",
                   fence.c_str(), why.c_str());
    }
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host.empty() ? "127.0.0.1" : host;
    core->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        fence, "gloo: cannot use address '", host, "' (DDPRUN_HOST) for TCP: ", e.what()));
  }
  // One full mesh of Gloo pairs between `size` members, bootstrapped through
  // our store under prefix.
  auto connect = [&](const std::string& prefix, int rank, int size, bool sync)
      -> absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(options.timeout);
    if (size == 1) return ctx;
    GlooStoreAdapter adapter(store, key_prefix + prefix, options.timeout);
    try {
      ctx->connectFullMesh(adapter, core->device);
      for (int i = 0; sync && i < size; ++i) {
        if (i != rank) ctx->getPair(i)->setSync(true, false);
      }
    } catch (const std::exception& e) {
      if (!adapter.error().ok()) {
        const absl::Status& s = adapter.error();
        return absl::Status(s.code(), absl::StrCat(fence, "gloo bootstrap through the store: ",
                                                   s.message()));
      }
      return absl::UnavailableError(absl::StrCat(fence, "gloo bootstrap: connecting to the other ",
                                                 size - 1, " ranks failed: ", e.what()));
    }
    return ctx;
  };
  auto ctx = connect("gloo/", info.rank, info.world_size, /*sync=*/false);
  if (!ctx.ok()) return ctx.status();
  core->context = *ctx;
  core->sync_max_bytes = WmemMax();
  if (core->shm) {
    // Hierarchical all-reduce: the hosts' first ranks (leaders) all-reduce
    // the hosts' sums among themselves.
    core->leader = layout.local_index == 0;
    if (core->leader) {
      auto lctx = connect("gloo-leaders/", layout.host, layout.num_hosts, /*sync=*/false);
      if (!lctx.ok()) return lctx.status();
      core->leaders = *lctx;
      auto lsync = connect("gloo-leaders-sync/", layout.host, layout.num_hosts, /*sync=*/true);
      if (!lsync.ok()) return lsync.status();
      core->leaders_sync = *lsync;
    }
  } else if (info.world_size > 1) {
    // The sync-mode mesh serves small all-reduces (see SyncAllreduceMaxBytes).
    auto sync_ctx = connect("gloo-sync/", info.rank, info.world_size, /*sync=*/true);
    if (!sync_ctx.ok()) return sync_ctx.status();
    core->sync_context = *sync_ctx;
  }
  auto backend = std::make_shared<GlooBackend>(info, options.timeout, core);
  backend->Start();
  return std::shared_ptr<Backend>(backend);
}

}  // namespace ddp::detail
