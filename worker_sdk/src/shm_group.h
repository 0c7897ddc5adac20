// ShmGroup: the collectives of a group whose ranks all run on one host,
// through one shared memory segment instead of TCP loopback.
//
// Segment (made by rank 0 with memfd_create, opened by the others through
// /proc/<pid>/fd/<fd>, so nothing is left in /dev/shm when a rank dies):
//
//   ShmHeader | ShmRankState[size] | in[2][size] | res[2]     (slots of chunk_bytes)
//
// Protocol. Every rank issues the same collectives in the same order (the
// group's contract). A collective is cut into steps of at most chunk_bytes;
// step k uses buffer set k % 2. A step writes its slots, passes a barrier,
// reads (all-reduce: reduces its share, a second barrier, reads the results).
// A rank writes buffer set b again only at step k + 2, after it passed step
// k + 1's first barrier, which every rank reached only after its reads of
// step k: two buffer sets need no barrier at the end of a step.
//
// All-reduce step of n elements: rank r owns elements [n*r/W, n*(r+1)/W). Each
// rank copies the others' shares of its input to in[b][rank]; after the
// barrier, rank r folds its share over ranks 0, 1, ..., W-1 in that order into
// res[b] (its own input read in place; kAvg divided there; the last fold
// writes res[b] and the rank's own output in one pass, elementwise.h's
// ReduceFn2, where its share lies in one buffer and the op is not kAvg) and
// after the second barrier every rank copies res[b]. Every element is computed once, in
// one order, so every rank ends with the same bits (unlike a per-rank
// summation order). The input may be a list of buffers (the Reducer's
// buckets): the copies gather from it and scatter back; a share that spans
// two buffers is gathered into the rank's own slot first.
//
// Direct path. When every rank's buffer of a (non-small, single-buffer)
// all-reduce lies in shareable memory (shared_buffers.h: ProcessGroup::
// AllocMemory, the Reducer's buckets), there is no staging: each rank
// announces where its buffer is (memfd, offset) next to the collective's
// signature, and after the first barrier every rank maps its peers' buffers
// (once per buffer, cached) and folds its share straight from every rank's
// buffer, in rank order, writing the result straight into every rank's
// buffer (per rank: S read, S written, no copy-in, no copy-out); a second
// barrier ends it. Same order of folds, so the same bits as the staged path.
// Ranks whose buffers are not all shareable run the staged steps below; a
// rank with a private buffer copies step 0's shares in before the first
// barrier (as before), a rank with a shareable one after it, and when both
// kinds meet, one more barrier follows (every rank knows from the
// announcements).
//
// Small all-reduces (at most small_allreduce_bytes()) take one barrier, not
// two: every rank copies its whole input to in[b][rank], passes the barrier,
// then folds in[b][0..W-1] in rank order into its own buffer (the same bits
// on every rank, and the same as the two-barrier path's). Each rank reads
// W x bytes, which for small messages is cheaper than a second barrier. Such
// an all-reduce (and a barrier) can be split in two halves that may run on
// two threads one after the other (Post, then Complete): the caller posts
// and, when the peers are already there, completes it itself; otherwise the
// communication thread completes it (gloo_backend.cc).
//
// Barrier: one shared counter; barrier number e completes when it reaches
// e*W (mod 2^32). Waiters spin (2 us, or up to 50 us while no missing peer
// last ran on the waiter's CPU), spin yielding the CPU, then sleep on
// the counter with FUTEX_WAIT in slices, checking between slices for peers
// that died (their pidfd polls readable: no wait for the agent to reap
// them), the agent's word that the group is broken (WatchBreaks), a failure another rank published
// (the first failing rank writes its cause: a dead peer, a timeout, an Abort(); then wakes
// everyone) and the deadline. Nothing waits without a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddprun::rendezvous {
class Store;
}

namespace ddp::detail {

// Bytes per rank per step. 1 MiB keeps a step's working set ((W+1) slots
// read and written) near the last-level cache while barriers stay rare.
inline constexpr std::size_t kDefaultShmChunkBytes = std::size_t(1) << 20;
// The most memory one host's segment takes: with more than 127 ranks on a
// host the steps shrink below kDefaultShmChunkBytes to stay within it.
inline constexpr std::size_t kMaxShmSegmentBytes = std::size_t(256) << 20;

struct ShmHeader;
struct ShmRankState;

// One buffer of a list all-reduced as if concatenated.
struct ShmPiece {
  void* data;
  std::size_t bytes;
};

class ShmGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // Bytes of a segment for `size` ranks.
  static std::size_t SegmentBytes(int size, std::size_t chunk_bytes);
  // Lays out a zeroed segment of SegmentBytes(size, chunk_bytes) at base.
  static void Format(void* base, int size, std::size_t chunk_bytes);

  // Rank `rank` of the group whose segment (formatted) is mapped at base.
  // With owns_mapping the destructor unmaps it. `fence` prefixes messages.
  ShmGroup(void* base, std::size_t bytes, int rank, bool owns_mapping);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t chunk_bytes() const { return chunk_; }

  // The collectives, in place, blocking until done or `deadline`. Errors:
  // DeadlineExceeded (naming the ranks that did not arrive), Unavailable (a
  // peer died: rank and pid), Aborted (a rank aborted the group). After an
  // error the group is aborted for every rank.
  absl::Status Allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                         Clock::time_point deadline);
  // The same over the concatenation of `pieces` (whole elements each): the
  // Reducer's buckets without packing them first. Same bits as Allreduce of
  // the packed buffer.
  absl::Status Allreduce(const std::vector<ShmPiece>& pieces, DType dtype, ReduceOp op,
                         Clock::time_point deadline);
  absl::Status Broadcast(void* data, std::size_t bytes, int root, Clock::time_point deadline);
  // `in` holds `bytes`; out receives size()*bytes, rank-major.
  absl::Status Allgather(const void* in, void* out, std::size_t bytes, Clock::time_point deadline);
  absl::Status Barrier(Clock::time_point deadline);

  // The largest all-reduce (bytes) that takes the one-barrier path.
  std::size_t small_allreduce_bytes() const { return small_; }
  // A collective posted by this rank and not yet completed.
  struct Posted {
    std::uint32_t target = 0;  // the barrier count that completes it
    int buffer = 0;
    bool allreduce = false;
    std::size_t count = 0;
    DType dtype = DType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
  };
  // The first half of a small all-reduce (count * DTypeSize(dtype) <=
  // small_allreduce_bytes()): posts `data` (read now, not after) and arrives.
  absl::Status PostAllreduce(const void* data, std::size_t count, DType dtype, ReduceOp op,
                             Posted* posted);
  // The first half of a barrier: arrives.
  absl::Status PostBarrier(Posted* posted);
  // Whether every rank arrived at `posted`'s barrier, waiting at most
  // `yield_until`: spins, and after `spin` yields the CPU instead when a
  // missing peer last ran on this CPU (it waits for this core).
  bool Arrived(const Posted& posted, std::chrono::nanoseconds spin,
               std::chrono::nanoseconds yield_until) const;
  // The second half: waits for the others (until deadline), checks that they
  // issued the same collective, and (all-reduce) writes the result to data.
  // The next collective of this group starts only after it.
  absl::Status Complete(const Posted& posted, void* data, Clock::time_point deadline);

  // Marks the group aborted for every rank and wakes the waiting ones.
  // Thread-safe; the first abort wins.
  void Abort();
  // The same, because job rank `lost_rank` (-1: unknown) is gone: every
  // rank's waiting collective fails with a PeerLost status (status.h).
  void AbortPeerLost(int lost_rank);
  // Waiting collectives also fail (PeerLost, rank unknown) once *generation
  // is past `formed` (the in-place control block's generation: the agent
  // broke the group). Checked at every sleep slice, like the peers' pids.
  // Set before the first collective; `generation` outlives the group.
  void WatchBreaks(const std::atomic<std::uint64_t>* generation, std::uint64_t formed) {
    break_generation_ = generation;
    formed_generation_ = formed;
  }

  // All-reduces that took the direct path (for tests and the debug log).
  std::uint64_t direct_allreduces() const { return direct_; }

  // The job's rank of each member, for messages (default: the member index).
  void set_rank_names(std::vector<int> names) { names_ = std::move(names); }

 private:
  // A peer's shareable buffer mapped into this process.
  struct PeerMapping {
    std::uint64_t serial = 0;
    std::int32_t fd = -1;
    char* base = nullptr;
    std::size_t bytes = 0;
  };
  // Rank `member`'s buffer of the current collective in this process's
  // address space (maps it on first use). Unavailable when it cannot be
  // mapped (the group is aborted then, so that no rank waits for this one).
  absl::StatusOr<char*> PeerBuffer(int member, const char* op);
  absl::Status DirectAllreduce(char* mine, std::size_t count, DType dtype, ReduceOp op,
                               Clock::time_point deadline);
  char* Slot(int buffer, int rank) const;
  char* Result(int buffer) const;
  int NextBuffer() { return static_cast<int>(step_++ & 1); }
  absl::Status Sync(const char* op, Clock::time_point deadline);
  absl::Status Wait(std::uint32_t target, const char* op, Clock::time_point deadline);
  // Why the group was aborted, as the other ranks report it.
  enum class AbortKind : std::uint32_t {
    kAborted = 0,
    kPeerDied = 1,
    kTimedOut = 2,
    kMismatch = 3,
    kPeerLost = 4,  // subject: a job rank (-1: the agent broke the group)
  };
  // Every collective announces what it is; after its first barrier each rank
  // compares (CheckSame), so mismatched collectives fail instead of mixing data.
  enum class OpKind : std::uint8_t { kAllreduce = 1, kBroadcast, kAllgather, kBarrier };
  void Begin(OpKind kind, DType dtype, ReduceOp op, int root, std::uint64_t count);
  absl::Status CheckSame(const char* op);
  static std::string DescribeSig(const std::uint64_t* sig);
  // A barrier; after the first of a collective, CheckSame.
  absl::Status Barrier(const char* op, Clock::time_point deadline);
  // The first half of a barrier: this rank arrives; *target completes it.
  absl::Status Arrive(const char* op, std::uint32_t* target);
  void AbortFor(AbortKind kind, int subject, std::int32_t pid);
  absl::Status AbortedStatus(const char* op) const;
  std::vector<int> Missing() const;  // members that did not reach this barrier
  // Whether member r's process (pid) has exited: its pidfd polls readable
  // (an exited process that is not reaped yet counts), or, where pidfds are
  // not available, kill(pid, 0) says ESRCH.
  bool PeerExited(int r, std::int32_t pid);
  bool BrokenByAgent() const {
    return break_generation_ != nullptr &&
           break_generation_->load(std::memory_order_acquire) > formed_generation_;
  }
  // Whether a member that did not reach this barrier last ran on this CPU.
  bool PeerSharesCpu() const;
  int Name(int member) const {
    return member >= 0 && member < static_cast<int>(names_.size()) ? names_[member] : member;
  }

  ShmHeader* header_;
  ShmRankState* ranks_;
  char* data_;
  void* base_;
  std::size_t bytes_;
  int rank_;
  int size_;
  std::size_t chunk_;
  std::size_t small_;
  bool owns_;
  std::uint32_t epoch_ = 0;       // barriers this rank passed
  std::uint64_t step_ = 0;        // steps this rank ran (buffer set = step % 2)
  std::uint64_t collective_ = 0;  // collectives this rank issued (sig slot)
  bool check_pending_ = false;
  std::vector<int> names_;
  std::vector<char> packed_;                     // a small all-reduce of several buffers, packed
  std::vector<std::vector<PeerMapping>> peers_;  // by member: their buffers mapped here
  std::vector<char> fold_;                       // the direct path's fold, in cache
  std::uint64_t direct_ = 0;
  std::vector<int> pidfds_;  // by member: -1 until opened (this rank's own stays -1)
  const std::atomic<std::uint64_t>* break_generation_ = nullptr;
  std::uint64_t formed_generation_ = 0;
};

// Which ranks share a host. Hosts are numbered in the order of their lowest
// rank; a host's ranks are listed in ascending order.
struct HostLayout {
  int num_hosts = 1;
  int host = 0;              // this rank's host
  std::vector<int> local;    // the ranks on this rank's host
  int local_index = 0;       // this rank's position in `local`
  std::vector<int> leaders;  // the lowest rank of each host, by host
};

// The layout from every rank's host identity (ids[r] is rank r's).
HostLayout LayoutFromIdentities(const std::vector<std::string>& ids, int rank);

// Every rank publishes its host identity (boot id, pid namespace and user;
// DDP_SHM_HOST_ID overrides it) under key_prefix + "shm/id/<rank>" and reads
// everyone's: every rank computes the same layout.
absl::StatusOr<HostLayout> ExchangeHostLayout(const WorkerInfo& info,
                                              ddprun::rendezvous::Store& store,
                                              const std::string& key_prefix, Duration timeout);

// Sets up the ShmGroup of this rank's host (keys under key_prefix + "shm/").
// Every rank of the job reaches the same answer: groups when every rank could
// map its host's segment; nullptr otherwise, with the first failing rank and
// why in *why. Errors only for store failures.
absl::StatusOr<std::unique_ptr<ShmGroup>> ConnectShmGroup(
    const HostLayout& layout, const WorkerInfo& info, ddprun::rendezvous::Store& store,
    const std::string& key_prefix, Duration timeout, std::size_t chunk_bytes, std::string* why);

}  // namespace ddp::detail
