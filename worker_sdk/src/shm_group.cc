#include "shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/store/store.h"
#include "elementwise.h"
#include "sdk_env.h"
#include "shared_buffers.h"
#include "status.h"

namespace ddp::detail {

inline constexpr std::uint64_t kShmMagic = 0x3270'6d68'7370'6464ULL;  // "ddpshmp2"

struct alignas(64) ShmHeader {
  std::uint64_t magic;
  std::uint32_t size;
  std::uint32_t reserved;
  std::uint64_t chunk_bytes;
  std::uint64_t data_offset;
  // Random, published with the segment's address: a rank that opened
  // something else (a stale or foreign pid/fd) finds out before writing.
  std::uint64_t nonce;
  // The barrier counter (a futex word) and how many ranks sleep on it.
  alignas(64) std::atomic<std::uint32_t> arrived;
  std::atomic<std::uint32_t> sleepers;
  // 0 while the group runs; member + 1 of the first rank that aborted it.
  // That rank first wins `abort_claim`, writes why (kind, the member it is
  // about, its pid), then publishes aborted_by (release).
  alignas(64) std::atomic<std::uint32_t> aborted_by;
  std::atomic<std::uint32_t> abort_claim;
  std::uint32_t abort_kind;  // ShmGroup::AbortKind
  std::int32_t abort_subject;
  std::int32_t abort_pid;
};

struct alignas(64) ShmRankState {
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> epoch;  // barriers this rank entered
  // The CPU this rank ran on when it last entered a barrier: a waiter whose
  // missing peer ran on its own CPU yields at once instead of spinning.
  std::atomic<std::int32_t> cpu;
  // What this rank's collective number c is (ShmGroup::OpSig), in slot c % 2:
  // written before the collective's first barrier, read by the others after
  // it. A rank writes slot c % 2 again only for collective c + 2, after every
  // rank passed the first barrier of c + 1, i.e. after they all checked c.
  std::uint64_t sig[2][2];
  // Where this rank's buffer of collective c is (slot c % 2, written and read
  // like sig): a large all-reduce's buffer in shareable memory
  // (shared_buffers.h), or serial 0 when it is private.
  struct {
    std::uint64_t serial;
    std::int64_t fd;
    std::uint64_t buffer_bytes;
    std::uint64_t offset;
  } note[2];
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

namespace {

constexpr std::size_t kPage = 4096;
// How long a waiter spins, then spins yielding the CPU (more ranks than
// cores: the rank it waits for may need this core), before it sleeps; and how
// long it sleeps between checks of the deadline, an abort and its peers'
// pids. Waking a sleeper costs tens of microseconds on a VM.
//
// Spinning helps when the missing peers run on other cores and hurts when
// one waits for this core: a waiter spins kSpin, then goes on spinning up to
// kSpinAlone only while no missing peer last ran on its CPU (PeerSharesCpu),
// else it yields at once. On a busy machine (2 cores, load 13), unpinned
// ranks often share a core: a 20 us plain spin took 1-16 MiB all-reduces at 2
// ranks from 0.12-3.7 ms to 0.18-4.1 ms, and 4 KiB calls from 16 to 115 us;
// pinned to their own cores (as mpirun pins), yielding handed the core to
// another process for a scheduler slice.
constexpr auto kSpin = std::chrono::microseconds(2);
constexpr auto kSpinAlone = std::chrono::microseconds(50);
constexpr auto kYieldSpin = std::chrono::microseconds(1000);
constexpr auto kSleepSlice = std::chrono::milliseconds(10);

// Small all-reduces: one barrier while every rank's read of all W inputs
// (W x bytes) stays this small. 2 ranks, pinned, back to back, p50: 256 KiB
// in one barrier 24 us, in two 32-37 us; 64 KiB 7.5 us either way.
constexpr std::size_t kSmallAllreduceReadBytes = std::size_t(512) << 10;

std::size_t RoundUp(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

std::size_t DataOffset(int size) {
  return RoundUp(sizeof(ShmHeader) + sizeof(ShmRankState) * static_cast<std::size_t>(size), kPage);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::uint32_t* FutexWord(std::atomic<std::uint32_t>* a) {
  return reinterpret_cast<std::uint32_t*>(a);
}

// Shared (not FUTEX_PRIVATE) futex: the word lives in a MAP_SHARED segment.
void FutexWait(std::atomic<std::uint32_t>* a, std::uint32_t expected, std::chrono::nanoseconds t) {
  timespec ts{static_cast<time_t>(t.count() / 1000000000),
              static_cast<long>(t.count() % 1000000000)};
  ::syscall(SYS_futex, FutexWord(a), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<std::uint32_t>* a) {
  ::syscall(SYS_futex, FutexWord(a), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

std::size_t ShmGroup::SegmentBytes(int size, std::size_t chunk_bytes) {
  return DataOffset(size) + chunk_bytes * 2 * (static_cast<std::size_t>(size) + 1);
}

void ShmGroup::Format(void* base, int size, std::size_t chunk_bytes) {
  auto* h = new (base) ShmHeader();
  h->magic = kShmMagic;
  h->size = static_cast<std::uint32_t>(size);
  h->chunk_bytes = chunk_bytes;
  h->data_offset = DataOffset(size);
  h->arrived.store(0);
  h->sleepers.store(0);
  h->aborted_by.store(0);
  h->abort_claim.store(0);
  h->abort_kind = 0;
  h->abort_subject = -1;
  h->abort_pid = 0;
  auto* r = reinterpret_cast<ShmRankState*>(h + 1);
  for (int i = 0; i < size; ++i) new (r + i) ShmRankState{};
}

ShmGroup::ShmGroup(void* base, std::size_t bytes, int rank, bool owns_mapping)
    : header_(static_cast<ShmHeader*>(base)),
      ranks_(reinterpret_cast<ShmRankState*>(header_ + 1)),
      data_(static_cast<char*>(base) + header_->data_offset),
      base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(static_cast<int>(header_->size)),
      chunk_(header_->chunk_bytes),
      small_(std::min<std::size_t>(chunk_, kSmallAllreduceReadBytes / size_)),
      owns_(owns_mapping) {
  ranks_[rank_].pid.store(static_cast<std::int32_t>(::getpid()));
  peers_.resize(static_cast<std::size_t>(size_));
  pidfds_.assign(static_cast<std::size_t>(size_), -1);
}

ShmGroup::~ShmGroup() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
  for (auto& maps : peers_) {
    for (PeerMapping& m : maps) ::munmap(m.base, m.bytes);
  }
  if (owns_) ::munmap(base_, bytes_);
}

char* ShmGroup::Slot(int buffer, int rank) const {
  return data_ + (static_cast<std::size_t>(buffer) * (size_ + 1) + rank) * chunk_;
}

char* ShmGroup::Result(int buffer) const { return Slot(buffer, size_); }

void ShmGroup::Abort() { AbortFor(AbortKind::kAborted, -1, 0); }

void ShmGroup::AbortPeerLost(int lost_rank) { AbortFor(AbortKind::kPeerLost, lost_rank, 0); }

bool ShmGroup::PeerExited(int r, std::int32_t pid) {
  if (pid <= 0 || pid == static_cast<std::int32_t>(::getpid())) return false;  // threads as ranks
  int& fd = pidfds_[static_cast<std::size_t>(r)];
  if (fd < 0) fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

void ShmGroup::AbortFor(AbortKind kind, int subject, std::int32_t pid) {
  std::uint32_t none = 0;
  if (header_->abort_claim.compare_exchange_strong(none, 1)) {
    header_->abort_kind = static_cast<std::uint32_t>(kind);
    header_->abort_subject = subject;
    header_->abort_pid = pid;
    header_->aborted_by.store(static_cast<std::uint32_t>(rank_) + 1, std::memory_order_release);
  }
  // Waiters sleep on `arrived`; they re-check the flag when woken.
  FutexWakeAll(&header_->arrived);
}

absl::Status ShmGroup::AbortedStatus(const char* op) const {
  const std::uint32_t by = header_->aborted_by.load(std::memory_order_acquire);
  if (by == 0) return absl::OkStatus();
  const int who = static_cast<int>(by) - 1;
  const int subject = header_->abort_subject;
  switch (static_cast<AbortKind>(header_->abort_kind)) {
    case AbortKind::kPeerDied:
      return PeerLostStatus(
          absl::StrCat(op, ": rank ", Name(subject), " (pid ", header_->abort_pid, ") died"),
          Name(subject));
    case AbortKind::kPeerLost:
      if (subject < 0) {
        return PeerLostStatus(absl::StrCat(op,
                                           ": the agent reports this group broken (a peer "
                                           "failed); ddp::Reconfigure gives the new round's group"),
                              -1);
      }
      return PeerLostStatus(absl::StrCat(op, ": rank ", subject, " is gone"), subject);
    case AbortKind::kTimedOut:
      if (subject < 0) break;
      return absl::DeadlineExceededError(
          absl::StrCat(op, ": rank ", Name(who), " timed out waiting for rank ", Name(subject)));
    case AbortKind::kMismatch:
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": rank ", Name(who), " found that the ranks issued different ",
                       "collectives (rank ", Name(subject), " differs; its error says how)"));
    case AbortKind::kAborted:
      break;
  }
  if (who == rank_) return absl::AbortedError(absl::StrCat(op, ": the group was aborted"));
  return absl::AbortedError(
      absl::StrCat(op, ": rank ", Name(who), " aborted the group (its own error names why)"));
}

bool ShmGroup::PeerSharesCpu() const {
  const int cpu = ::sched_getcpu();
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ &&
        static_cast<std::int32_t>(ranks_[r].epoch.load(std::memory_order_relaxed) - epoch_) < 0 &&
        ranks_[r].cpu.load(std::memory_order_relaxed) == cpu) {
      return true;
    }
  }
  return false;
}

std::vector<int> ShmGroup::Missing() const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (static_cast<std::int32_t>(ranks_[r].epoch.load() - epoch_) < 0) missing.push_back(r);
  }
  return missing;
}

void ShmGroup::Begin(OpKind kind, DType dtype, ReduceOp op, int root, std::uint64_t count) {
  const std::uint64_t word =
      static_cast<std::uint64_t>(kind) | static_cast<std::uint64_t>(dtype) << 8 |
      static_cast<std::uint64_t>(op) << 16 | static_cast<std::uint64_t>(root + 1) << 24;
  std::uint64_t* sig = ranks_[rank_].sig[collective_ & 1];
  sig[0] = word;
  sig[1] = count;
  check_pending_ = true;
}

std::string ShmGroup::DescribeSig(const std::uint64_t* sig) {
  const auto kind = static_cast<OpKind>(sig[0] & 0xff);
  const auto dtype = static_cast<DType>((sig[0] >> 8) & 0xff);
  const auto op = static_cast<ReduceOp>((sig[0] >> 16) & 0xff);
  const int root = static_cast<int>((sig[0] >> 24) & 0xffff) - 1;
  switch (kind) {
    case OpKind::kAllreduce:
      return absl::StrCat("allreduce(", sig[1], " x ", DTypeName(dtype), ", ", ReduceOpName(op),
                          ")");
    case OpKind::kBroadcast:
      return absl::StrCat("broadcast(", sig[1], " bytes, root ", root, ")");
    case OpKind::kAllgather:
      return absl::StrCat("allgather(", sig[1], " bytes)");
    case OpKind::kBarrier:
      return "barrier";
  }
  return "an unknown collective";
}

// After a collective's first barrier: did every rank issue the same one?
absl::Status ShmGroup::CheckSame(const char* op) {
  check_pending_ = false;
  const int slot = static_cast<int>(collective_++ & 1);
  const std::uint64_t* mine = ranks_[rank_].sig[slot];
  for (int r = 0; r < size_; ++r) {
    const std::uint64_t* theirs = ranks_[r].sig[slot];
    if (theirs[0] == mine[0] && theirs[1] == mine[1]) continue;
    AbortFor(AbortKind::kMismatch, r, 0);
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the ranks issued different collectives: this rank (", Name(rank_), ") ",
        DescribeSig(mine), ", rank ", Name(r), " ", DescribeSig(theirs),
        "; every rank must issue the same collectives with the same sizes, in the same order"));
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::Sync(const char* op, Clock::time_point deadline) {
  absl::Status s = Barrier(op, deadline);
  if (s.ok() && check_pending_) return CheckSame(op);
  return s;
}

absl::Status ShmGroup::Barrier(const char* op, Clock::time_point deadline) {
  std::uint32_t target = 0;
  DDPRUN_RETURN_IF_ERROR(Arrive(op, &target));
  return Wait(target, op, deadline);
}

absl::Status ShmGroup::Arrive(const char* op, std::uint32_t* target) {
  DDPRUN_RETURN_IF_ERROR(AbortedStatus(op));
  ++epoch_;
  ranks_[rank_].cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  ranks_[rank_].epoch.store(epoch_, std::memory_order_relaxed);
  *target = epoch_ * static_cast<std::uint32_t>(size_);
  const std::uint32_t now = header_->arrived.fetch_add(1) + 1;
  // Last to arrive. seq_cst pairs with the waiter's sleepers++ then load of
  // `arrived`: either it sees our add, or we see it sleeping.
  if (now == *target && header_->sleepers.load() != 0) FutexWakeAll(&header_->arrived);
  return absl::OkStatus();
}

bool ShmGroup::Arrived(const Posted& posted, std::chrono::nanoseconds spin,
                       std::chrono::nanoseconds yield_until) const {
  auto reached = [&] {
    return static_cast<std::int32_t>(header_->arrived.load(std::memory_order_acquire) -
                                     posted.target) >= 0;
  };
  if (reached()) return true;
  const auto start = Clock::now();
  for (int i = 1;; ++i) {
    if (reached()) return true;
    if ((i & 63) == 0) {
      const auto spun = Clock::now() - start;
      if (spun >= yield_until || (spun >= spin && PeerSharesCpu())) break;
    }
    CpuRelax();
  }
  // Then yielding the CPU: the peer waits for this core.
  while (Clock::now() - start < yield_until) {
    if (reached()) return true;
    ::sched_yield();
  }
  return reached();
}

absl::Status ShmGroup::PostAllreduce(const void* data, std::size_t count, DType dtype, ReduceOp op,
                                     Posted* posted) {
  const std::size_t bytes = count * DTypeSize(dtype);
  Begin(OpKind::kAllreduce, dtype, op, -1, count);
  posted->buffer = NextBuffer();
  posted->allreduce = true;
  posted->count = count;
  posted->dtype = dtype;
  posted->op = op;
  if (size_ > 1 && bytes > 0) std::memcpy(Slot(posted->buffer, rank_), data, bytes);
  return Arrive("allreduce", &posted->target);
}

absl::Status ShmGroup::PostBarrier(Posted* posted) {
  Begin(OpKind::kBarrier, DType::kFloat32, ReduceOp::kSum, -1, 0);
  posted->allreduce = false;
  return Arrive("barrier", &posted->target);
}

absl::Status ShmGroup::Complete(const Posted& posted, void* data, Clock::time_point deadline) {
  const char* op = posted.allreduce ? "allreduce" : "barrier";
  DDPRUN_RETURN_IF_ERROR(Wait(posted.target, op, deadline));
  if (check_pending_) DDPRUN_RETURN_IF_ERROR(CheckSame(op));
  if (!posted.allreduce || posted.count == 0) return absl::OkStatus();
  // Every rank folds ranks 0..W-1 in order: the same bits everywhere.
  const int b = posted.buffer;
  const std::size_t n = posted.count;
  if (size_ > 1) {
    const ReduceFn fn = ReduceFunc(posted.dtype, posted.op);
    fn(data, Slot(b, 0), Slot(b, 1), n);
    for (int r = 2; r < size_; ++r) fn(data, data, Slot(b, r), n);
  }
  if (posted.op == ReduceOp::kAvg) DivideInPlace(data, n, posted.dtype, size_);
  return absl::OkStatus();
}

absl::Status ShmGroup::Wait(std::uint32_t target, const char* op, Clock::time_point deadline) {
  auto reached = [&](std::uint32_t v) { return static_cast<std::int32_t>(v - target) >= 0; };
  const auto start = Clock::now();
  for (int i = 1;; ++i) {
    if (reached(header_->arrived.load(std::memory_order_acquire))) return absl::OkStatus();
    if ((i & 63) == 0) {
      const auto spun = Clock::now() - start;
      if (spun >= kSpinAlone || (spun >= kSpin && PeerSharesCpu())) break;
    }
    CpuRelax();
  }
  while (Clock::now() - start < kYieldSpin) {
    if (reached(header_->arrived.load(std::memory_order_acquire))) return absl::OkStatus();
    if (header_->aborted_by.load(std::memory_order_relaxed) != 0) break;
    ::sched_yield();
  }
  // Sleeping. Between slices: a dead peer, a failure another rank published
  // (naming its cause), the deadline. Each is re-checked against `arrived`
  // after it is seen: a rank that arrived, finished and then aborted (or
  // died) must not fail a peer still leaving the same barrier. Its arrival
  // happens before its abort, so a load of `arrived` after seeing the abort
  // sees the arrival.
  for (;;) {
    if (reached(header_->arrived.load(std::memory_order_acquire))) return absl::OkStatus();
    for (int r = 0; r < size_; ++r) {
      const std::int32_t pid = ranks_[r].pid.load();
      if (r != rank_ && PeerExited(r, pid)) {
        if (reached(header_->arrived.load())) return absl::OkStatus();
        AbortFor(AbortKind::kPeerDied, r, pid);
        return AbortedStatus(op);
      }
    }
    if (BrokenByAgent()) {
      if (reached(header_->arrived.load())) return absl::OkStatus();
      AbortFor(AbortKind::kPeerLost, -1, 0);
      return AbortedStatus(op);
    }
    if (auto s = AbortedStatus(op); !s.ok()) {
      if (reached(header_->arrived.load())) return absl::OkStatus();
      return s;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      std::vector<int> missing = Missing();
      AbortFor(AbortKind::kTimedOut, missing.empty() ? -1 : missing.front(), 0);
      for (int& m : missing) m = Name(m);
      return absl::DeadlineExceededError(
          absl::StrCat(op, ": rank(s) ", absl::StrJoin(missing, ", "), " did not arrive in time"));
    }
    header_->sleepers.fetch_add(1);
    const std::uint32_t v = header_->arrived.load();
    if (reached(v)) {
      header_->sleepers.fetch_sub(1);
      return absl::OkStatus();
    }
    FutexWait(&header_->arrived, v, std::min<Clock::duration>(kSleepSlice, deadline - now));
    header_->sleepers.fetch_sub(1);
    if (reached(header_->arrived.load(std::memory_order_acquire))) return absl::OkStatus();
  }
}

namespace {

// Byte ranges of a list of buffers taken as one concatenated buffer.
class Pieces {
 public:
  explicit Pieces(const std::vector<ShmPiece>& pieces) : pieces_(pieces) {
    std::size_t at = 0;
    for (const ShmPiece& p : pieces_) {
      starts_.push_back(at);
      at += p.bytes;
    }
  }
  // dst <- bytes [off, off + n) of the concatenation.
  void Gather(std::size_t off, char* dst, std::size_t n) const {
    ForEach(off, n, [&](char* piece, std::size_t done, std::size_t len) {
      std::memcpy(dst + done, piece, len);
    });
  }
  // Bytes [off, off + n) as one pointer when they lie in one buffer, else null.
  const char* Contiguous(std::size_t off, std::size_t n) const {
    if (pieces_.empty()) return nullptr;
    const std::size_t i = Index(off);
    if (off - starts_[i] + n > pieces_[i].bytes) return nullptr;
    return static_cast<const char*>(pieces_[i].data) + (off - starts_[i]);
  }
  // Bytes [off, off + n) of the concatenation <- src.
  void Scatter(std::size_t off, const char* src, std::size_t n) const {
    ForEach(off, n, [&](char* piece, std::size_t done, std::size_t len) {
      std::memcpy(piece, src + done, len);
    });
  }

 private:
  // The buffer that holds byte `off` (the last one that starts at or before it).
  std::size_t Index(std::size_t off) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), off);
    return static_cast<std::size_t>(it - starts_.begin()) - 1;
  }
  template <class Fn>
  void ForEach(std::size_t off, std::size_t n, Fn&& fn) const {
    if (n == 0) return;
    std::size_t i = Index(off);
    std::size_t done = 0;
    while (done < n) {
      const std::size_t in_piece = off + done - starts_[i];
      const std::size_t len = std::min(pieces_[i].bytes - in_piece, n - done);
      if (len > 0) fn(static_cast<char*>(pieces_[i].data) + in_piece, done, len);
      done += len;
      ++i;
    }
  }
  const std::vector<ShmPiece>& pieces_;
  std::vector<std::size_t> starts_;
};

}  // namespace

absl::Status ShmGroup::Allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                 Clock::time_point deadline) {
  return Allreduce({ShmPiece{data, count * DTypeSize(dtype)}}, dtype, op, deadline);
}

absl::Status ShmGroup::Allreduce(const std::vector<ShmPiece>& pieces, DType dtype, ReduceOp op,
                                 Clock::time_point deadline) {
  const std::size_t es = DTypeSize(dtype);
  std::size_t total = 0;
  for (const ShmPiece& p : pieces) total += p.bytes;
  const std::size_t count = total / es;
  if (total <= small_) {
    // One barrier; a list of buffers is packed in a private buffer first.
    const Pieces view(pieces);
    void* data = pieces.size() == 1 ? pieces[0].data : nullptr;
    const bool pack = data == nullptr && total > 0;
    if (pack) {
      if (packed_.size() < total) packed_.resize(total);
      view.Gather(0, packed_.data(), total);
      data = packed_.data();
    }
    Posted posted;
    DDPRUN_RETURN_IF_ERROR(PostAllreduce(data, count, dtype, op, &posted));
    DDPRUN_RETURN_IF_ERROR(Complete(posted, data, deadline));
    if (pack) view.Scatter(0, packed_.data(), total);
    return absl::OkStatus();
  }
  Begin(OpKind::kAllreduce, dtype, op, -1, count);
  // Where this rank's buffer is (the direct path needs every rank's in
  // shareable memory); read by the others after the first barrier.
  auto& note = ranks_[rank_].note[collective_ & 1];
  const std::optional<SharedRef> ref =
      pieces.size() == 1 ? FindShared(pieces[0].data, total) : std::nullopt;
  note.serial = ref ? ref->serial : 0;
  note.fd = ref ? ref->fd : -1;
  note.buffer_bytes = ref ? ref->buffer_bytes : 0;
  note.offset = ref ? ref->offset : 0;
  const int slot = static_cast<int>(collective_ & 1);  // CheckSame advances collective_
  const Pieces view(pieces);
  const std::size_t per_step = chunk_ / es;
  const ReduceFn fn = ReduceFunc(dtype, op);
  // Fused last fold (not for kAvg, which divides the result afterwards).
  const ReduceFn2 fn2 = size_ > 1 && op != ReduceOp::kAvg ? ReduceFunc2(dtype, op) : nullptr;
  const auto w = static_cast<std::size_t>(size_);
  for (std::size_t off = 0; off < count; off += per_step) {
    const std::size_t n = std::min(per_step, count - off);
    const std::size_t at = off * es;  // this step's first byte in the input
    const int b = NextBuffer();
    const std::size_t lo = n * rank_ / w;
    const std::size_t hi = n * (rank_ + 1) / w;
    // The others' shares of this rank's input (the copy into shared memory
    // is also the packing of a list of buffers).
    char* mine = Slot(b, rank_);
    auto copy_in = [&] {
      view.Gather(at, mine, lo * es);
      view.Gather(at + hi * es, mine + hi * es, (n - hi) * es);
    };
    // This rank's own share is read where it is, unless it spans buffers.
    const char* own = view.Contiguous(at + lo * es, (hi - lo) * es);
    if (own == nullptr) {
      view.Gather(at + lo * es, mine + lo * es, (hi - lo) * es);
      own = mine + lo * es;
    }
    if (off > 0) {
      copy_in();
      DDPRUN_RETURN_IF_ERROR(Sync("allreduce", deadline));
    } else {
      // Step 0's barrier is also where the ranks learn each other's buffers.
      if (!ref) copy_in();
      DDPRUN_RETURN_IF_ERROR(Sync("allreduce", deadline));
      int shareable = 0;
      for (int r = 0; r < size_; ++r) shareable += ranks_[r].note[slot].serial != 0 ? 1 : 0;
      if (shareable == size_) {
        --step_;  // no staging buffer set was used
        ++direct_;
        return DirectAllreduce(static_cast<char*>(pieces[0].data), count, dtype, op, deadline);
      }
      if (shareable > 0) {
        // Mixed: the ranks with a shareable buffer stage step 0 now.
        if (ref) copy_in();
        DDPRUN_RETURN_IF_ERROR(Sync("allreduce", deadline));
      }
    }
    if (hi > lo) {
      // This rank's share, folded over ranks 0..W-1 in order.
      auto src = [&](int r) -> const char* { return r == rank_ ? own : Slot(b, r) + lo * es; };
      char* res = Result(b) + lo * es;
      const std::size_t m = hi - lo;
      if (fn2 != nullptr && own != mine + lo * es) {
        // The last fold writes the shared result and this rank's own output
        // (its input, in place) in one pass.
        char* own_out = const_cast<char*>(own);
        if (size_ == 2) {
          fn2(res, own_out, src(0), src(1), m);
        } else {
          fn(res, src(0), src(1), m);
          for (int r = 2; r + 1 < size_; ++r) fn(res, res, src(r), m);
          fn2(res, own_out, res, src(size_ - 1), m);
        }
      } else {
        if (size_ == 1) {
          std::memcpy(res, src(0), m * es);
        } else {
          fn(res, src(0), src(1), m);
          for (int r = 2; r < size_; ++r) fn(res, res, src(r), m);
        }
        // Averages while the share is in cache, once for every rank.
        if (op == ReduceOp::kAvg) DivideInPlace(res, m, dtype, size_);
        // This rank's own result now, while the others still reduce theirs.
        view.Scatter(at + lo * es, res, m * es);
      }
    }
    DDPRUN_RETURN_IF_ERROR(Sync("allreduce", deadline));
    view.Scatter(at, Result(b), lo * es);
    view.Scatter(at + hi * es, Result(b) + hi * es, (n - hi) * es);
  }
  return absl::OkStatus();
}

absl::StatusOr<char*> ShmGroup::PeerBuffer(int member, const char* op) {
  const auto& note = ranks_[member].note[(collective_ - 1) & 1];  // CheckSame advanced it
  if (member == rank_) return absl::InternalError("PeerBuffer of this rank");
  std::vector<PeerMapping>& maps = peers_[member];
  for (const PeerMapping& m : maps) {
    if (m.serial == note.serial) return m.base + note.offset;
  }
  // A buffer not seen yet. One of this peer's with the same fd was freed
  // (the peer closed the fd, which the new buffer reuses): drop its mapping.
  for (auto it = maps.begin(); it != maps.end();) {
    if (it->fd == note.fd) {
      ::munmap(it->base, it->bytes);
      it = maps.erase(it);
    } else {
      ++it;
    }
  }
  const std::int32_t pid = ranks_[member].pid.load();
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", note.fd);
  std::string error;
  void* p = MAP_FAILED;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) {
    error = absl::StrCat("open ", path, ": ", std::strerror(errno));
  } else if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != note.buffer_bytes) {
    error = absl::StrCat(path, " is not the buffer rank ", Name(member), " announced (", st.st_size,
                         " bytes, expected ", note.buffer_bytes, ")");
  } else {
    p = ::mmap(nullptr, note.buffer_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
               0);
    if (p == MAP_FAILED) error = absl::StrCat("mmap ", path, ": ", std::strerror(errno));
  }
  if (fd >= 0) ::close(fd);
  if (!error.empty()) {
    Abort();
    return absl::UnavailableError(
        absl::StrCat(op, ": cannot map rank ", Name(member), "'s buffer (", error, ")"));
  }
  maps.push_back(PeerMapping{note.serial, static_cast<std::int32_t>(note.fd), static_cast<char*>(p),
                             note.buffer_bytes});
  return static_cast<char*>(p) + note.offset;
}

absl::Status ShmGroup::DirectAllreduce(char* mine, std::size_t count, DType dtype, ReduceOp op,
                                       Clock::time_point deadline) {
  // Every rank's buffer, here.
  std::vector<char*> buf(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      buf[r] = mine;
    } else {
      DDPRUN_ASSIGN_OR_RETURN(buf[r], PeerBuffer(r, "allreduce"));
    }
  }
  const std::size_t es = DTypeSize(dtype);
  const auto w = static_cast<std::size_t>(size_);
  const std::size_t lo = count * rank_ / w;
  const std::size_t hi = count * (rank_ + 1) / w;
  const ReduceFn fn = ReduceFunc(dtype, op);
  const ReduceFn2 fn2 = op != ReduceOp::kAvg ? ReduceFunc2(dtype, op) : nullptr;
  if (size_ == 2 && fn2 != nullptr) {
    // One pass: read both shares, write the result into both buffers.
    char* a = buf[0] + lo * es;
    char* b = buf[1] + lo * es;
    fn2(a, b, a, b, hi - lo);
  } else if (size_ > 1) {
    // Folded in cache-sized pieces into fold_, ranks in order, then written
    // to every buffer (the last fold writes fold_ and rank 0's at once).
    constexpr std::size_t kFoldBytes = std::size_t(64) << 10;
    const std::size_t per = kFoldBytes / es;
    if (fold_.size() < per * es) fold_.resize(per * es);
    char* t = fold_.data();
    for (std::size_t off = lo; off < hi; off += per) {
      const std::size_t m = std::min(per, hi - off);
      const std::size_t at = off * es;
      auto src = [&](int r) { return buf[r] + at; };
      if (fn2 != nullptr) {  // (more than 2 ranks)
        fn(t, src(0), src(1), m);
        for (int r = 2; r + 1 < size_; ++r) fn(t, t, src(r), m);
        fn2(t, src(0), t, src(size_ - 1), m);
        for (int r = 1; r < size_; ++r) std::memcpy(src(r), t, m * es);
      } else {
        fn(t, src(0), src(1), m);
        for (int r = 2; r < size_; ++r) fn(t, t, src(r), m);
        if (op == ReduceOp::kAvg) DivideInPlace(t, m, dtype, size_);
        for (int r = 0; r < size_; ++r) std::memcpy(src(r), t, m * es);
      }
    }
  } else if (op == ReduceOp::kAvg) {
    DivideInPlace(mine, count, dtype, 1);
  }
  // Every result is in every buffer when every rank passed this.
  return Sync("allreduce", deadline);
}

absl::Status ShmGroup::Broadcast(void* data, std::size_t bytes, int root,
                                 Clock::time_point deadline) {
  Begin(OpKind::kBroadcast, DType::kFloat32, ReduceOp::kSum, root, bytes);
  char* p = static_cast<char*>(data);
  for (std::size_t off = 0; off < bytes; off += chunk_) {
    const std::size_t n = std::min(chunk_, bytes - off);
    const int b = NextBuffer();
    if (rank_ == root) std::memcpy(Slot(b, root), p + off, n);
    DDPRUN_RETURN_IF_ERROR(Sync("broadcast", deadline));
    if (rank_ != root) std::memcpy(p + off, Slot(b, root), n);
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::Allgather(const void* in, void* out, std::size_t bytes,
                                 Clock::time_point deadline) {
  Begin(OpKind::kAllgather, DType::kFloat32, ReduceOp::kSum, -1, bytes);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (std::size_t off = 0; off < bytes; off += chunk_) {
    const std::size_t n = std::min(chunk_, bytes - off);
    const int b = NextBuffer();
    std::memcpy(Slot(b, rank_), src + off, n);
    DDPRUN_RETURN_IF_ERROR(Sync("allgather", deadline));
    for (int r = 0; r < size_; ++r) {
      char* to = dst + static_cast<std::size_t>(r) * bytes + off;
      if (to != src + off) std::memcpy(to, Slot(b, r), n);
    }
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::Barrier(Clock::time_point deadline) {
  Posted posted;
  DDPRUN_RETURN_IF_ERROR(PostBarrier(&posted));
  return Complete(posted, nullptr, deadline);
}

// ---- Bootstrap ----

namespace {

namespace rdzv = ddprun::rendezvous;

// What must be equal for ranks to share memory: the kernel instance, the pid
// namespace (peers' pids are checked and /proc/<pid>/fd opened) and the user.
// DDP_SHM_HOST_ID, `override` when not empty, replaces it (tests simulate
// several hosts on one machine).
std::string HostIdentity(const std::string& override) {
  if (!override.empty()) return override;
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st {};
  const std::uint64_t pidns = ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
  return absl::StrCat(boot, "|", pidns, "|", ::getuid());
}

struct Mapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
};

absl::StatusOr<Mapping> MapFd(int fd, std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
  }
  return Mapping{p, bytes};
}

std::vector<std::string> RankKeys(const std::string& prefix, int world) {
  std::vector<std::string> k;
  for (int r = 0; r < world; ++r) k.push_back(absl::StrCat(prefix, r));
  return k;
}

}  // namespace

HostLayout LayoutFromIdentities(const std::vector<std::string>& ids, int rank) {
  HostLayout l;
  std::vector<std::string> seen;
  std::vector<int> host_of(ids.size());
  for (std::size_t r = 0; r < ids.size(); ++r) {
    auto it = std::find(seen.begin(), seen.end(), ids[r]);
    if (it == seen.end()) {
      seen.push_back(ids[r]);
      l.leaders.push_back(static_cast<int>(r));
      it = seen.end() - 1;
    }
    host_of[r] = static_cast<int>(it - seen.begin());
  }
  l.num_hosts = static_cast<int>(seen.size());
  l.host = host_of[rank];
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (host_of[r] == l.host) {
      if (static_cast<int>(r) == rank) l.local_index = static_cast<int>(l.local.size());
      l.local.push_back(static_cast<int>(r));
    }
  }
  return l;
}

absl::StatusOr<HostLayout> ExchangeHostLayout(const WorkerInfo& info, rdzv::Store& store,
                                              const std::string& key_prefix, Duration timeout) {
  const std::string p = key_prefix + "shm/id/";
  DDPRUN_ASSIGN_OR_RETURN(const SdkEnv env, ReadSdkEnv());
  DDPRUN_RETURN_IF_ERROR(store.Set(absl::StrCat(p, info.rank), HostIdentity(env.shm_host_id)));
  DDPRUN_ASSIGN_OR_RETURN(const std::vector<std::string> ids,
                          store.MultiGet(RankKeys(p, info.world_size), timeout));
  return LayoutFromIdentities(ids, info.rank);
}

absl::StatusOr<std::unique_ptr<ShmGroup>> ConnectShmGroup(
    const HostLayout& layout, const WorkerInfo& info, rdzv::Store& store,
    const std::string& key_prefix, Duration timeout, std::size_t chunk_bytes, std::string* why) {
  why->clear();
  const int w = static_cast<int>(layout.local.size());
  const std::string p = absl::StrCat(key_prefix, "shm/host", layout.host, "/");

  // 1. The host's first rank makes the segment and publishes "<pid>/<fd>",
  // or "!<why>".
  // Many ranks on one host: smaller steps, so that the segment stays within
  // kMaxShmSegmentBytes (each rank has two slots, plus two result slots).
  const std::size_t fit =
      kMaxShmSegmentBytes / (2 * (static_cast<std::size_t>(w) + 1)) / kPage * kPage;
  chunk_bytes = std::max<std::size_t>(kPage, std::min(chunk_bytes, fit));
  const std::size_t bytes = ShmGroup::SegmentBytes(w, chunk_bytes);
  const std::uint64_t nonce =
      (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  Mapping map;
  int fd = -1;
  std::string error;
  if (layout.local_index == 0) {
    fd = ::memfd_create("ddprun-shm", MFD_CLOEXEC);
    if (fd < 0) {
      error = absl::StrCat("memfd_create: ", std::strerror(errno));
    } else if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
      error = absl::StrCat("cannot allocate ", bytes >> 20,
                           " MiB of shared memory: ", std::strerror(e));
    } else if (auto m = MapFd(fd, bytes); !m.ok()) {
      error = std::string(m.status().message());
    } else {
      map = *m;
      ShmGroup::Format(map.base, w, chunk_bytes);
      static_cast<ShmHeader*>(map.base)->nonce = nonce;
    }
    const std::string seg =
        error.empty() ? absl::StrCat(::getpid(), "/", fd, "/", nonce) : "!" + error;
    if (auto s = store.Set(p + "segment", seg); !s.ok()) {
      if (map.base != MAP_FAILED) ::munmap(map.base, map.bytes);
      if (fd >= 0) ::close(fd);
      return s;
    }
  } else {
    // (A StatusOr, not DDPRUN_ASSIGN_OR_RETURN: GCC 12 warns of a maybe-
    // uninitialized moved std::string there.)
    const absl::StatusOr<std::string> seg = store.Get(p + "segment", timeout);
    DDPRUN_RETURN_IF_ERROR(seg);
    if (!seg->empty() && (*seg)[0] == '!') {
      error = seg->substr(1);
    } else {
      // "<pid>/<fd>/<nonce>"
      const std::vector<std::string> parts = absl::StrSplit(*seg, '/');
      std::uint64_t want_nonce = 0;
      struct stat st {};
      const std::string path =
          parts.size() == 3 ? absl::StrCat("/proc/", parts[0], "/fd/", parts[1]) : "";
      if (path.empty() || !absl::SimpleAtoi(parts[2], &want_nonce)) {
        error = absl::StrCat("the segment address '", *seg, "' is garbled");
      } else if (fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC); fd < 0) {
        error = absl::StrCat("open ", path, ": ", std::strerror(errno));
      } else if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
        error = absl::StrCat(path, " is not the host's segment (", st.st_size, " bytes, expected ",
                             bytes, "): is DDP_SHM_HOST_ID shared by two machines?");
      } else if (auto m = MapFd(fd, bytes); !m.ok()) {
        error = std::string(m.status().message());
      } else {
        const auto* h = static_cast<const ShmHeader*>(m->base);
        if (h->magic != kShmMagic || h->nonce != want_nonce ||
            h->size != static_cast<std::uint32_t>(w) || h->chunk_bytes != chunk_bytes) {
          ::munmap(m->base, m->bytes);
          error = absl::StrCat(path,
                               " is not the host's segment (its header differs): is "
                               "DDP_SHM_HOST_ID shared by two machines?");
        } else {
          map = *m;
        }
      }
    }
  }
  // The mapping keeps the memory; the creator's fd stays open until every
  // rank reported (they report after their open).
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } close_fd{fd};

  std::unique_ptr<ShmGroup> group;
  if (error.empty()) {
    group = std::make_unique<ShmGroup>(map.base, map.bytes, layout.local_index,
                                       /*owns_mapping=*/true);
    group->set_rank_names(layout.local);
  }
  // 2. Every rank of the job reports; the path is used only if every rank
  // (on every host) mapped its segment, so that all ranks run one algorithm.
  const std::string ok = absl::StrCat(key_prefix, "shm/ok/");
  DDPRUN_RETURN_IF_ERROR(store.Set(absl::StrCat(ok, info.rank), error.empty() ? "" : "!" + error));
  DDPRUN_ASSIGN_OR_RETURN(auto oks, store.MultiGet(RankKeys(ok, info.world_size), timeout));
  for (int r = 0; r < info.world_size; ++r) {
    if (!oks[r].empty()) {
      *why = absl::StrCat("rank ", r, ": ", oks[r].substr(1));
      return std::unique_ptr<ShmGroup>();
    }
  }
  return group;
}

}  // namespace ddp::detail
