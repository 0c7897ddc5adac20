// The CPU backend (ddp::Backend::kGloo): collectives over Gloo's TCP
// transport and shared memory, bootstrapped through our store.
//
// Collectives are queued to one communication thread per group and run there
// in issue order (comm_queue.h), so the caller (the backward pass) goes on
// while they run. Gloo has no abort: a failed or timed-out group is marked
// aborted, queued work is failed, and the thread finishes the operation it is
// in when Gloo's own timeout (the group timeout) fires. Everything the thread
// touches lives in a Core it keeps alive, so a group destroyed while its
// thread is stuck in Gloo leaves the thread to finish on its own.
//
// Small all-reduces (the latency-bound ones) run on a second Gloo context whose
// pairs are in sync mode: the communication thread reads and writes its
// sockets itself. On the default (async) context every receive goes through
// Gloo's device loop thread, which spins on epoll while our thread holds the
// pair lock (Pair::handleEvents only try-locks); on a 2-core machine a spinner
// that preempts the lock holder burns a whole scheduler slice, and those calls
// took 4 ms instead of 0.3 ms (docs/benchmarks.md, worker SDK). Which size
// takes which context: SyncAllreduceMaxBytes (cpu_topology.h); the algorithms:
// gloo_ops.h. Gloo bootstraps through our store with GlooStoreAdapter.
//
// The CPU backend: shared memory between the ranks of a host (shm_group.h)
// and Gloo's TCP transport between hosts. Init learns which ranks share a
// host, then (CpuPath, cpu_topology.h):
//   one host            every collective through shared memory; no Gloo mesh
//                       (memcpy bandwidth instead of TCP loopback);
//   several hosts, some all-reduces hierarchical: the host's sum in shared
//   with several ranks  memory, an all-reduce of the hosts' sums among the
//                       hosts' first ranks (their own Gloo mesh, sync-mode at
//                       two hosts), a shared memory broadcast back; the other
//                       collectives on a Gloo mesh of all ranks;
//   one rank per host   Gloo only.
// DDP_SHM=0 (InitOptions::shared_memory) opts out of shared memory.
// On one host, small all-reduces and barriers issued while the queue is idle
// are started by the caller itself and finished there when the peers are
// already waiting (CallerRuns): no thread handoff on the latency path.
#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "backend.h"
#include "comm_queue.h"
#include "cpu_topology.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/store/store.h"
#include "elementwise.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo_loop_ticker.h"
#include "gloo_mesh.h"
#include "gloo_ops.h"
#include "metrics.h"
#include "sdk_env.h"
#include "shared_buffers.h"
#include "shm_group.h"
#include "status.h"

namespace ddp::detail {
namespace {

namespace rdzv = ddprun::rendezvous;

// A failed shared-memory collective, thrown inside a task like Gloo's
// exceptions and turned into its Status by the communication thread.
struct ShmFailure {
  absl::Status status;
};

void ThrowIfFailed(absl::Status s) {
  if (!s.ok()) throw ShmFailure{std::move(s)};
}

ShmGroup::Clock::time_point DeadlineIn(Duration t) { return ShmGroup::Clock::now() + t; }

// How long a caller that posted a small collective waits for its peers
// before it leaves the rest to the communication thread (CallerRuns): it
// spins kCallerSpin, then spins on while the missing peers run on other
// cores or yields to one that shares its core (ShmGroup::Arrived), up to
// kCallerYield. Measured at 2 unpinned ranks on 2 busy cores (load 12), p50
// of 4 KiB calls back to back: 20 us of plain spinning 115 us, 5 us then
// yielding 25 us, 0.5-2 us then yielding (50 us-1 ms) 14-19 us; pinned 1.6 us.
constexpr auto kCallerSpin = std::chrono::microseconds(2);
constexpr auto kCallerYield = std::chrono::microseconds(50);
// How long a rank that saw a connection close without knowing whose waits
// for another rank's record of the lost rank (Core::AgreeOnLost).
constexpr auto kLostLookup = std::chrono::milliseconds(200);
// How long a TCP group's watcher, told by the agent that the group is
// broken, waits for a rank to record which peer was lost before it fails
// the group without a name.
constexpr auto kNameWait = std::chrono::milliseconds(20);
// How often a TCP group's watcher reads the in-place control block's
// generation (WatchBreaks): a tenth of the 100 ms fail-fast goal.
constexpr auto kBreakPoll = std::chrono::milliseconds(5);

// What the group's collectives use; the communication thread keeps it alive.
// It is the only owner of the contexts and the device (tasks reach them
// through it), so that the device and its loop are gone when it is.
class Core {
 public:
  // Declared first, destroyed last: after the device's loop (see ~Core).
  std::unique_ptr<LoopTicker> ticker;
  std::shared_ptr<gloo::Context> context;
  // Pairs in sync mode, for small all-reduces (see the top of this file);
  // null for a group of one.
  std::shared_ptr<gloo::Context> sync_context;
  std::size_t sync_max_bytes = 0;  // net.core.wmem_max
  std::shared_ptr<gloo::transport::Device> device;
  // The ranks of this host, when some host has more than one. With one host
  // every collective uses it and there are no Gloo contexts; with several,
  // all-reduces are hierarchical: shm, then the leaders' contexts (set on
  // each host's first rank only), then an shm broadcast.
  std::unique_ptr<ShmGroup> shm;
  bool leader = false;
  std::shared_ptr<gloo::Context> leaders;
  std::shared_ptr<gloo::Context> leaders_sync;
  // Reused scratch for reduce-scatter (first-touch page faults are slow).
  std::vector<char> scratch;
  // A lost peer (docs/sdk.md, "Errors"): the store and the group's key
  // prefix, where the first rank that sees a peer gone records which one
  // (first wins), and every Gloo pair's listening address -> the job rank
  // that owns it (Gloo's messages name the peer by address).
  std::shared_ptr<rdzv::Store> store;
  std::string key_prefix;
  std::map<std::string, int> rank_of_address;

  // Closes every Gloo connection of this rank (hard close: the peers' reads
  // fail at once), so that a failure reaches every rank of the group instead
  // of only the dead peer's neighbours. Only on a thread that is not inside
  // Gloo on these pairs (the communication thread after a task failed, or a
  // caller that holds the queue's claim): sync-mode pairs hold their lock
  // while they read.
  void CloseConnections() {
    LoopTicker::Ticking ticking(ticker.get());  // each async pair leaves the loop
    for (auto* ctx : {&context, &sync_context, &leaders, &leaders_sync}) {
      if (*ctx) (*ctx)->closeConnections();
    }
  }
  // Closing the pairs and the device waits for turns of the device's loop:
  // ticked (gloo_loop_ticker.h).
  ~Core() {
    LoopTicker::Ticking ticking(ticker.get());
    for (auto* ctx : {&context, &sync_context, &leaders, &leaders_sync}) ctx->reset();
    device.reset();
  }

  // The job rank whose Gloo address `what` names, or -1.
  int RankNamedIn(const std::string& what) const {
    for (const auto& [addr, rank] : rank_of_address) {
      for (std::size_t at = what.find(addr); at != std::string::npos;
           at = what.find(addr, at + 1)) {
        const std::size_t end = at + addr.size();
        if (end >= what.size() || !std::isdigit(static_cast<unsigned char>(what[end]))) {
          return rank;
        }
      }
    }
    return -1;
  }
  // The lost rank a rank recorded (AgreeOnLost), or -1; does not wait.
  int RecordedLost() const {
    if (!store) return -1;
    auto recorded = store->Get(key_prefix + "lost", Duration::zero());
    int lost = -1;
    if (recorded.ok() && absl::SimpleAtoi(*recorded, &lost)) return lost;
    return -1;
  }
  // Records `candidate` as the group's lost rank unless a rank recorded one
  // first, and returns the recorded one (the first observer of a death
  // records it before it closes its connections, so ranks that only see
  // those closes learn the real one). Without the store: `candidate`. When
  // the store does not answer, -1: the round's store is gone when the agent
  // has already formed the next round (a one-node job's TCPStore), and by
  // then the connection that closed on this rank may be a survivor's that
  // gave up its group, not the lost rank's.
  int AgreeOnLost(int candidate) const {
    if (!store) return candidate;
    if (candidate < 0) {
      // This rank cannot tell who: take what a rank that could recorded.
      auto recorded = store->Get(key_prefix + "lost", kLostLookup);
      int agreed = -1;
      if (recorded.ok() && absl::SimpleAtoi(*recorded, &agreed)) return agreed;
      return candidate;
    }
    std::string current;
    auto swapped =
        store->CompareSet(key_prefix + "lost", std::nullopt, std::to_string(candidate), &current);
    if (!swapped.ok()) {
      DDPRUN_DEBUG_LOG(kSdk) << "cannot record rank " << candidate
                             << " as lost in the group's store (" << swapped.status().message()
                             << "): naming no rank";
      return -1;
    }
    int agreed = candidate;
    if (!*swapped && absl::SimpleAtoi(current, &agreed)) return agreed;
    return candidate;
  }
};

class GlooBackend final : public Backend, public std::enable_shared_from_this<GlooBackend> {
 public:
  GlooBackend(WorkerInfo info, Duration timeout, std::shared_ptr<Core> core)
      : Backend(std::move(info), timeout), core_(std::move(core)) {}

  // A thread stuck in Gloo on an aborted group finishes on its own.
  ~GlooBackend() override {
    StopWatcher();
    queue_.Stop(/*detach_if_busy=*/aborted());
  }

  void WatchBreaks(const std::atomic<std::uint64_t>* generation, std::uint64_t formed) override {
    if (core_->shm) core_->shm->WatchBreaks(generation, formed);
    // Shared memory waits poll the word themselves; a rank inside Gloo
    // (sockets) cannot, so a watcher fails the group for it.
    if (!core_->context && !core_->leaders) return;
    watcher_ = std::thread([this, generation, formed] {
      std::unique_lock<std::mutex> lock(watch_mu_);
      while (!watch_stop_) {
        if (generation->load(std::memory_order_acquire) > formed) {
          lock.unlock();
          // Name the rank when a rank that saw its connection close recorded
          // it (Core::AgreeOnLost), or when this rank's own collective fails
          // naming it meanwhile; the agent's word alone after kNameWait.
          const auto until = std::chrono::steady_clock::now() + kNameWait;
          int lost = -1;
          while (!aborted() && lost < 0 && std::chrono::steady_clock::now() < until) {
            lost = core_->RecordedLost();
            if (lost < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          if (lost >= 0) {
            Fail(absl::StrCat("rank ", lost, " is gone (the agent reports this group broken)"),
                 lost);
          } else {
            Fail("the agent reports this group broken (a peer failed)", -1);
          }
          return;
        }
        watch_cv_.wait_for(lock, kBreakPoll);
      }
    });
  }

  void Start() {
    queue_.Start(
        [weak = weak_from_this()](const std::string& desc, std::exception_ptr e) {
          return Classify(desc, e, weak);
        },
        core_);
  }

  ddp::Backend kind() const override { return ddp::Backend::kGloo; }

  absl::StatusOr<WorkPtr> Allreduce(void* data, std::size_t count, DType dtype,
                                    ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "allreduce", data, count, dtype));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "allreduce", op));
    const OpDesc desc{"allreduce", count, dtype, ReduceOpName(op)};
    if (count == 0) return Enqueue(desc, nullptr);
    const int n = size();
    if (n == 1) {
      return Enqueue(desc, [=] {
        if (op == ReduceOp::kAvg) DivideInPlace(data, count, dtype, 1);
      });
    }
    const Duration t = timeout();
    if (ShmGroup* one_host = OneHostShm()) {
      if (count * DTypeSize(dtype) <= one_host->small_allreduce_bytes()) {
        return CallerRuns(desc, one_host, data, [=](ShmGroup::Posted* p) {
          return one_host->PostAllreduce(data, count, dtype, op, p);
        });
      }
      return Enqueue(
          desc, [=] { ThrowIfFailed(one_host->Allreduce(data, count, dtype, op, DeadlineIn(t))); });
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
      TcpAllreduce(core->context, core->sync_context, core->sync_max_bytes, data, count, dtype, op,
                   tag, t);
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
    const OpDesc desc{"allreduce", count, dtype, ReduceOpName(op)};
    if (count == 0) return Enqueue(desc, nullptr);
    return Enqueue(desc, [=, t = timeout()] {
      ThrowIfFailed(shm->Allreduce(shm_pieces, dtype, op, DeadlineIn(t)));
    });
  }

  absl::StatusOr<WorkPtr> Broadcast(void* data, std::size_t count, DType dtype, int root) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "broadcast", data, count, dtype));
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Fence(), "broadcast: root ", root, " is not a rank of this group (size ", size(), ")"));
    }
    const OpDesc desc{"broadcast", count, dtype};
    if (count == 0 || size() == 1) return Enqueue(desc, nullptr);
    const Duration t = timeout();
    if (ShmGroup* shm = OneHostShm()) {
      return Enqueue(desc, [=] {
        ThrowIfFailed(shm->Broadcast(data, count * DTypeSize(dtype), root, DeadlineIn(t)));
      });
    }
    return Enqueue(desc, [=, core = core_.get(), tag = NextTag()] {
      gloo::BroadcastOptions opts(core->context);
      WithElementType(dtype,
                      [&](auto e) { opts.setOutput(static_cast<decltype(e)*>(data), count); });
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
    const OpDesc desc{"allgather", count, dtype};
    if (count == 0) return Enqueue(desc, nullptr);
    const std::size_t bytes = count * DTypeSize(dtype);
    if (size() == 1) {
      return Enqueue(desc, [=] {
        if (out != in) std::memmove(out, in, bytes);
      });
    }
    const Duration t = timeout();
    const std::size_t n = size();
    if (ShmGroup* shm = OneHostShm()) {
      return Enqueue(desc, [=] { ThrowIfFailed(shm->Allgather(in, out, bytes, DeadlineIn(t))); });
    }
    return Enqueue(desc, [=, core = core_.get(), tag = NextTag()] {
      gloo::AllgatherOptions opts(core->context);
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
  absl::StatusOr<WorkPtr> ReduceScatter(const void* in, void* out, std::size_t count, DType dtype,
                                        ReduceOp op) override {
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", in, count, dtype, "input"));
    DDPRUN_RETURN_IF_ERROR(CheckBuffer(*this, "reduce_scatter", out, count, dtype, "output"));
    DDPRUN_RETURN_IF_ERROR(CheckReduceOp(*this, "reduce_scatter", op));
    const OpDesc desc{"reduce_scatter", count, dtype, ReduceOpName(op)};
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
        WithElementType(
            dtype, [&](auto e) { opts.setOutput(reinterpret_cast<decltype(e)*>(s), count * n); });
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
    if (size() == 1) return Enqueue(OpDesc::Bare("barrier"), nullptr);
    const Duration t = timeout();
    if (ShmGroup* shm = OneHostShm()) {
      return CallerRuns(OpDesc::Bare("barrier"), shm, nullptr,
                        [=](ShmGroup::Posted* p) { return shm->PostBarrier(p); });
    }
    return Enqueue(OpDesc::Bare("barrier"), [=, core = core_.get(), tag = NextTag()] {
      gloo::BarrierOptions opts(core->context);
      opts.setTag(tag);
      opts.setTimeout(t);
      gloo::barrier(opts);
    });
  }

  // With ranks that share a host, shareable memory (shared_buffers.h): a
  // shared-memory all-reduce of it runs in place (shm_group.h's direct path).
  absl::StatusOr<void*> Alloc(std::size_t bytes) override {
    if (core_->shm != nullptr && core_->shm->size() > 1) {
      auto p = AllocShared(bytes);
      if (!p.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat(Fence(), "shared memory for ", bytes, " bytes: ", p.status().message()));
      }
      return *p;
    }
    void* p = nullptr;
    if (::posix_memalign(&p, 64, std::max<std::size_t>(bytes, 64)) != 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(Fence(), "out of memory for ", bytes, " bytes of buckets"));
    }
    // Touch every page now: first-touch page faults are slow on VMs.
    std::memset(p, 0, bytes);
    return p;
  }
  void Free(void* p) override {
    if (!FreeShared(p)) std::free(p);
  }
  absl::Status Copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

 protected:
  void OnAbort() override {
    const std::optional<int> lost = lost_rank();
    // Wakes a shared-memory collective in progress (and tells the peers).
    if (core_->shm) {
      if (lost) {
        core_->shm->AbortPeerLost(*lost);
      } else {
        core_->shm->Abort();
      }
    }
    // A lost peer: the collective in progress fails now, whether or not the
    // thread is still inside Gloo (it finishes or times out there alone).
    // So do the ones issued before the abort and still queued.
    auto lost_status = [&](const std::string& desc) {
      return PeerLostStatus(
          absl::StrCat(Fence(), desc, " failed: ",
                       *lost >= 0 ? absl::StrCat("rank ", *lost, " is gone") : abort_reason(),
                       "; ddp::Reconfigure gives the new round's group"),
          *lost);
    };
    // (On the queue's thread the failure is its own task's: it completes it
    // with the classified status, which names the operation and the cause.)
    if (lost && !queue_.OnQueueThread()) {
      if (std::shared_ptr<QueuedWork> running = queue_.Running()) {
        running->Complete(lost_status(running->desc()));
      }
    }
    // Fail what is queued; what runs finishes or times out inside Gloo.
    for (QueuedTask& t : queue_.TakeQueued()) {
      t.work->Complete(lost ? lost_status(t.desc) : AbortedStatus(t.desc));
    }
  }

 private:
  std::uint32_t NextTag() { return tag_++; }
  // The shared memory group when every rank is on this host (then there is
  // no Gloo context and every collective uses it).
  ShmGroup* OneHostShm() const { return core_->context ? nullptr : core_->shm.get(); }

  // A small shared-memory collective (post = its first half, ShmGroup::Post*)
  // run by the caller when nothing is queued: it posts, and when the peers
  // are already there (within kCallerSpin) completes it and returns it done,
  // with no thread handoff either way. Otherwise the communication thread
  // completes it while the caller goes on, so a caller never blocks on a late
  // peer. With work queued it is queued like any other collective.
  template <class Post>
  absl::StatusOr<WorkPtr> CallerRuns(const OpDesc& op, ShmGroup* shm, void* data, Post post) {
    if (aborted()) return AbortedStatus(op.Text());
    const auto deadline = DeadlineIn(timeout());
    if (!queue_.TryClaim()) {
      return Enqueue(op, [=] {
        ShmGroup::Posted p;
        ThrowIfFailed(post(&p));
        ThrowIfFailed(shm->Complete(p, data, deadline));
      });
    }
    // ddprun's monitoring (metrics.h): from the post to the completion,
    // wherever that happens.
    std::shared_ptr<detail::CollectiveRecord> rec = detail::BeginCollective(op, size());
    const std::string desc = op.Text();
    ShmGroup::Posted p;
    absl::Status s = post(&p);
    if (s.ok() && !shm->Arrived(p, kCallerSpin, kCallerYield)) {
      auto work = std::make_shared<QueuedWork>(weak_from_this(), desc, timeout());
      queue_.Release(QueuedTask{desc,
                                [=]() mutable {
                                  const auto done = std::move(rec);
                                  ThrowIfFailed(shm->Complete(p, data, deadline));
                                },
                                work});
      return work;
    }
    if (s.ok()) s = shm->Complete(p, data, deadline);
    rec.reset();
    queue_.Release();
    if (!s.ok()) s = ClassifyShm(desc, s, weak_from_this());
    return std::make_shared<DoneWork>(std::move(s));
  }

  absl::StatusOr<WorkPtr> Enqueue(const OpDesc& op, std::function<void()> run) {
    const std::string desc = op.Text();
    if (aborted()) return AbortedStatus(desc);
    run = RecordCollective(op, std::move(run), size());  // ddprun's monitoring (metrics.h)
    auto work = std::make_shared<QueuedWork>(weak_from_this(), desc, timeout());
    // Nothing to communicate (run null) still keeps issue order.
    queue_.Push(desc, std::move(run), work);
    return work;
  }

  // What a task threw, as its Status; aborts the group.
  static absl::Status Classify(const std::string& desc, std::exception_ptr e,
                               const std::weak_ptr<GlooBackend>& weak) {
    try {
      std::rethrow_exception(e);
    } catch (const ShmFailure& f) {
      return ClassifyShm(desc, f.status, weak);
    } catch (const std::exception& x) {
      return ClassifyGloo(desc, x.what(), weak);
    }
  }

  // A Gloo exception as a Status: timeouts are DeadlineExceeded; a closed or
  // reset connection is a lost peer (PeerLost, naming the rank the group
  // agreed on: Core::AgreeOnLost), after which this rank closes its own
  // connections so that every rank learns it at once; anything else is
  // Unavailable. Aborts the group. Runs on the communication thread.
  static absl::Status ClassifyGloo(const std::string& desc, const std::string& what,
                                   const std::weak_ptr<GlooBackend>& weak) {
    std::string fence;
    auto self = weak.lock();
    if (self) fence = self->Fence();
    // A peer sent more than this rank's buffer holds: Gloo's size check.
    if (what.find("op.buf->size_") != std::string::npos) {
      if (self) self->Fail(absl::StrCat(desc, ": ", what));
      return absl::InvalidArgumentError(absl::StrCat(
          fence, desc, " failed: a peer issued a collective of another size (every rank must ",
          "issue the same collectives with the same sizes, in the same order; gloo: ", what, ")"));
    }
    const bool timed_out =
        what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
    const bool closed = !timed_out && (what.find("Connection closed") != std::string::npos ||
                                       what.find("Read error") != std::string::npos ||
                                       what.find("Write error") != std::string::npos ||
                                       what.find("reset by peer") != std::string::npos ||
                                       what.find("Broken pipe") != std::string::npos);
    if (closed && self) {
      Core& core = *self->core_;
      const int named = core.RankNamedIn(what);
      if (named < 0) DDPRUN_DEBUG_LOG(kSdk) << fence << "no rank owns the address in: " << what;
      const int lost = core.AgreeOnLost(named);
      core.CloseConnections();
      const std::string who =
          lost >= 0 ? absl::StrCat("rank ", lost, " is gone") : std::string("a peer is gone");
      self->Fail(absl::StrCat(desc, ": ", who, " (gloo: ", what, ")"), lost);
      return PeerLostStatus(absl::StrCat(fence, desc, " failed: ", who,
                                         " (the group's connections closed; gloo: ", what, ")"),
                            lost);
    }
    if (self) self->Fail(absl::StrCat(desc, ": ", what));
    std::string msg = absl::StrCat(fence, desc, timed_out ? " timed out" : " failed",
                                   ": a peer died, hung or left the job (gloo: ", what, ")");
    return timed_out ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  }

  // A failed shared-memory collective (its message names the peer): fenced,
  // and the group aborted. A lost peer is recorded for the other hosts and
  // this rank's Gloo connections closed (see ClassifyGloo).
  static absl::Status ClassifyShm(const std::string& desc, const absl::Status& s,
                                  const std::weak_ptr<GlooBackend>& weak) {
    std::string fence;
    auto self = weak.lock();
    std::optional<int> lost = LostRankOf(s);
    if (self) {
      fence = self->Fence();
      if (lost && (self->core_->context || self->core_->leaders)) {
        lost = self->core_->AgreeOnLost(*lost);
        self->core_->CloseConnections();
      }
      self->Fail(absl::StrCat(desc, ": ", s.message()), lost);
    }
    return WithMessage(s, absl::StrCat(fence, desc, " failed (shared memory): ", s.message()));
  }

  void StopWatcher() {
    if (!watcher_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    watcher_.join();
  }

  std::shared_ptr<Core> core_;
  CommQueue queue_;  // stopped by the destructor
  std::uint32_t tag_ = 0;
  // WatchBreaks' thread (TCP paths only).
  std::thread watcher_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> CreateGlooBackend(const WorkerInfo& info,
                                                           const InitOptions& options,
                                                           std::shared_ptr<rdzv::Store> store,
                                                           const std::string& key_prefix) {
  auto core = std::make_shared<Core>();
  const std::string host = options.gloo_host.empty() ? info.host : options.gloo_host;
  const std::string fence = FenceOf(info);
  // Which ranks share a host decides the path (see the top of this file).
  HostLayout layout;
  if (options.shared_memory && info.world_size > 1) {
    auto l = ExchangeHostLayout(info, *store, key_prefix, options.timeout);
    if (!l.ok()) {
      return absl::Status(
          l.status().code(),
          absl::StrCat(fence, "host layout through the store: ", l.status().message()));
    }
    layout = *l;
  }
  if (WantSharedMemory(options.shared_memory, info.world_size, layout.num_hosts)) {
    std::string why;
    absl::StatusOr<SdkEnv> env = ReadSdkEnv();  // DDP_SHM_CHUNK, for tuning only
    if (!env.ok()) return absl::InvalidArgumentError(absl::StrCat(fence, env.status().message()));
    auto shm = ConnectShmGroup(layout, info, *store, key_prefix, options.timeout,
                               env->shm_chunk_bytes, &why);
    if (!shm.ok()) {
      return absl::Status(shm.status().code(),
                          absl::StrCat(fence, "shared memory bootstrap through the store: ",
                                       shm.status().message()));
    }
    core->shm = std::move(*shm);
    if (!core->shm && info.rank == 0) {
      std::fprintf(stderr,
                   "%sddp: no shared memory between the ranks of a host (%s); "
                   "collectives go over Gloo's TCP transport\n",
                   fence.c_str(), why.c_str());
    }
  }
  const CpuPath path = ChooseCpuPath(layout.num_hosts, core->shm != nullptr);
  DDPRUN_DEBUG_LOG(kSdk) << fence << "cpu path: "
                         << (path == CpuPath::kOneHostShm     ? "one host, shared memory"
                             : path == CpuPath::kHierarchical ? "hierarchical"
                                                              : "gloo tcp")
                         << " (" << layout.num_hosts << " host(s))";
  if (path == CpuPath::kOneHostShm) {
    auto backend = std::make_shared<GlooBackend>(info, options.timeout, core);
    backend->Start();
    return std::shared_ptr<Backend>(backend);
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host.empty() ? "127.0.0.1" : host;
    core->device = gloo::transport::tcp::CreateDevice(attr);
    core->ticker = LoopTicker::Attach(core->device);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(fence, "gloo: cannot use address '", host,
                                                   "' (DDPRUN_HOST) for TCP: ", e.what()));
  }
  // The meshes, from one exchange through the store (gloo_mesh.h): every
  // rank's (the sync-mode twin serves small all-reduces,
  // SyncAllreduceMaxBytes); with several hosts and shared memory, the hosts'
  // first ranks (leaders) all-reduce the hosts' sums among themselves instead.
  std::vector<int> everyone(info.world_size);
  for (int r = 0; r < info.world_size; ++r) everyone[r] = r;
  std::vector<MeshSpec> specs{{everyone, /*sync=*/false}};
  if (path == CpuPath::kHierarchical) {
    specs.push_back({layout.leaders, /*sync=*/false});
    specs.push_back({layout.leaders, /*sync=*/true});
  } else if (info.world_size > 1) {
    specs.push_back({everyone, /*sync=*/true});
  }
  LoopTicker::Ticking ticking(core->ticker.get());  // connect and setSync leave the loop
  absl::StatusOr<Meshes> meshes =
      ConnectMeshes(info, specs, core->device, *store, key_prefix + "gloo/", options.timeout);
  if (!meshes.ok()) {
    return absl::Status(meshes.status().code(), absl::StrCat(fence, meshes.status().message()));
  }
  core->context = meshes->contexts[0];
  if (path == CpuPath::kHierarchical) {
    core->leader = layout.local_index == 0;
    core->leaders = meshes->contexts[1];
    core->leaders_sync = meshes->contexts[2];
  } else if (specs.size() > 1) {
    core->sync_context = meshes->contexts[1];
  }
  core->rank_of_address = std::move(meshes->rank_of_address);
  core->sync_max_bytes = WmemMax();
  core->store = store;
  core->key_prefix = key_prefix;
  auto backend = std::make_shared<GlooBackend>(info, options.timeout, core);
  backend->Start();
  return std::shared_ptr<Backend>(backend);
}

}  // namespace ddp::detail
