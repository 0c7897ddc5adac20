// [unit] tests of the shared-memory collectives (shm_group.h): W threads of
// this process stand in for W ranks, each with its own ShmGroup over one
// MAP_SHARED anonymous mapping. No sockets, no store, no other process.
#include "shm_group.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "ddp/half.h"
#include "ddprun/rendezvous/store/store.h"
#include "elementwise.h"
#include "shared_buffers.h"

using ddp::DType;
using ddp::ReduceOp;
using ddp::detail::ShmGroup;
using namespace std::chrono_literals;

namespace {

// One segment and `size` ranks attached to it.
class Segment {
 public:
  Segment(int size, std::size_t chunk) : bytes_(ShmGroup::SegmentBytes(size, chunk)) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base_ != MAP_FAILED);
    ShmGroup::Format(base_, size, chunk);
    for (int r = 0; r < size; ++r) {
      ranks_.push_back(std::make_unique<ShmGroup>(base_, bytes_, r, /*owns_mapping=*/false));
    }
  }
  ~Segment() {
    ranks_.clear();
    ::munmap(base_, bytes_);
  }
  ShmGroup& rank(int r) { return *ranks_[r]; }
  int size() const { return static_cast<int>(ranks_.size()); }

  // Runs fn(rank) on one thread per rank; returns each rank's status.
  std::vector<absl::Status> Run(const std::function<absl::Status(int)>& fn) {
    std::vector<absl::Status> out(ranks_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
    for (auto& t : threads) t.join();
    return out;
  }

 private:
  std::size_t bytes_;
  void* base_;
  std::vector<std::unique_ptr<ShmGroup>> ranks_;
};

ShmGroup::Clock::time_point In(std::chrono::milliseconds t) { return ShmGroup::Clock::now() + t; }

void RequireAllOk(const std::vector<absl::Status>& s) {
  for (std::size_t r = 0; r < s.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(s[r].ok());
  }
}

template <class T>
T Value(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + rank * 13) % 23) - 11);
}

// Reference: rank-order fold of every rank's input, as the group computes it.
template <class T>
std::vector<T> Reference(int size, std::size_t n, ReduceOp op) {
  std::vector<T> acc(n);
  for (std::size_t i = 0; i < n; ++i) {
    T a = Value<T>(0, i);
    for (int r = 1; r < size; ++r) {
      T b = Value<T>(r, i);
      if (op == ReduceOp::kMax)
        a = a < b ? b : a;
      else if (op == ReduceOp::kMin)
        a = b < a ? b : a;
      else
        a = a + b;
    }
    if (op == ReduceOp::kAvg) a = a / static_cast<T>(size);
    acc[i] = a;
  }
  return acc;
}

template <class T>
void CheckAllreduce(int size, std::size_t n, ReduceOp op, std::size_t chunk) {
  Segment seg(size, chunk);
  std::vector<std::vector<T>> data(size, std::vector<T>(n));
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) data[r][i] = Value<T>(r, i);
  }
  RequireAllOk(seg.Run([&](int r) {
    return seg.rank(r).Allreduce(data[r].data(), n, ddp::DTypeOf<T>(), op, In(10s));
  }));
  const auto want = Reference<T>(size, n, op);
  for (int r = 0; r < size; ++r) {
    INFO("size " << size << " n " << n << " rank " << r << " op " << int(op));
    REQUIRE(data[r] == want);
  }
}

}  // namespace

TEST_CASE("shm allreduce: every op, 1-4 ranks, sizes across step boundaries", "[unit]") {
  // 64-byte steps: 16 floats per step, so 0..100 elements cross many steps and
  // leave some ranks with empty shares.
  for (int size = 1; size <= 4; ++size) {
    for (std::size_t n : {0, 1, 3, 16, 17, 100}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        CheckAllreduce<float>(size, n, op, 64);
        CheckAllreduce<double>(size, n, op, 64);
        CheckAllreduce<std::int32_t>(size, n, op, 64);
        CheckAllreduce<std::int64_t>(size, n, op, 64);
      }
    }
  }
}

TEST_CASE("shm allreduce: f16 and bf16 round once per term, in rank order", "[unit]") {
  using ddp::detail::BFloat16ToFloat;
  using ddp::detail::Float16ToFloat;
  using ddp::detail::FloatToBFloat16;
  using ddp::detail::FloatToFloat16;
  const int size = 3;
  const std::size_t n = 77;
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    auto to = dt == DType::kFloat16 ? FloatToFloat16 : FloatToBFloat16;
    auto from = dt == DType::kFloat16 ? Float16ToFloat : BFloat16ToFloat;
    Segment seg(size, 32);
    std::vector<std::vector<std::uint16_t>> data(size, std::vector<std::uint16_t>(n));
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < n; ++i) data[r][i] = to(0.1f * float(i) + 0.37f * float(r));
    }
    std::vector<std::uint16_t> want(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t a = data[0][i];
      for (int r = 1; r < size; ++r) a = to(from(a) + from(data[r][i]));
      want[i] = a;
    }
    RequireAllOk(seg.Run([&](int r) {
      return seg.rank(r).Allreduce(data[r].data(), n, dt, ReduceOp::kSum, In(10s));
    }));
    for (int r = 0; r < size; ++r) REQUIRE(data[r] == want);
  }
}

TEST_CASE("shm allreduce: every rank ends with the same bits (random f32, 4 ranks)", "[unit]") {
  const int size = 4;
  const std::size_t n = (1 << 16) + 5;
  Segment seg(size, 4096);
  std::mt19937 gen(42);
  std::normal_distribution<float> d(0.f, 1e3f);
  std::vector<std::vector<float>> data(size, std::vector<float>(n));
  for (auto& v : data) {
    for (auto& x : v) x = d(gen);
  }
  // The reference folds ranks 0..3 in order for every element.
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = ((data[0][i] + data[1][i]) + data[2][i]) + data[3][i];
  }
  // Several collectives back to back: buffer sets alternate across calls.
  for (int rep = 0; rep < 3; ++rep) {
    auto copy = data;
    RequireAllOk(seg.Run([&](int r) {
      return seg.rank(r).Allreduce(copy[r].data(), n, DType::kFloat32, ReduceOp::kSum, In(10s));
    }));
    for (int r = 0; r < size; ++r) REQUIRE(std::memcmp(copy[r].data(), want.data(), n * 4) == 0);
  }
}

TEST_CASE("shm broadcast, allgather and barrier", "[unit]") {
  for (int size = 1; size <= 4; ++size) {
    Segment seg(size, 64);
    const std::size_t bytes = 300;  // 5 steps of 64 bytes
    for (int root = 0; root < size; ++root) {
      std::vector<std::vector<char>> buf(size, std::vector<char>(bytes));
      for (int r = 0; r < size; ++r) {
        for (std::size_t i = 0; i < bytes; ++i) buf[r][i] = char(r * 31 + i);
      }
      RequireAllOk(seg.Run(
          [&](int r) { return seg.rank(r).Broadcast(buf[r].data(), bytes, root, In(10s)); }));
      for (int r = 0; r < size; ++r) REQUIRE(buf[r] == buf[root]);
    }
    std::vector<std::vector<char>> in(size, std::vector<char>(bytes));
    std::vector<std::vector<char>> out(size, std::vector<char>(bytes * size));
    std::vector<char> want;
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < bytes; ++i) in[r][i] = char(r * 7 + i * 3);
      want.insert(want.end(), in[r].begin(), in[r].end());
    }
    RequireAllOk(seg.Run(
        [&](int r) { return seg.rank(r).Allgather(in[r].data(), out[r].data(), bytes, In(10s)); }));
    for (int r = 0; r < size; ++r) REQUIRE(out[r] == want);
    RequireAllOk(seg.Run([&](int r) { return seg.rank(r).Barrier(In(10s)); }));
  }
}

TEST_CASE("shm: a rank that never arrives gives DeadlineExceeded naming it", "[unit]") {
  Segment seg(3, 64);
  float x = 1;
  const auto t0 = ShmGroup::Clock::now();
  auto s = seg.Run([&](int r) -> absl::Status {
    if (r == 2) return absl::OkStatus();  // never calls
    return seg.rank(r).Allreduce(&x, 1, DType::kFloat32, ReduceOp::kSum, In(300ms));
  });
  const auto took = ShmGroup::Clock::now() - t0;
  CHECK(took < 3s);
  for (int r = 0; r < 2; ++r) {
    INFO(s[r].ToString());
    // The first rank to time out fails the group: the other may report that.
    CHECK(s[r].code() == absl::StatusCode::kDeadlineExceeded);
  }
  const bool named = std::string(s[0].message()).find("rank(s) 2") != std::string::npos ||
                     std::string(s[1].message()).find("rank(s) 2") != std::string::npos;
  CHECK(named);
  // The group stays failed: the next collective fails at once, with the cause.
  auto again = seg.rank(2).Barrier(In(5s));
  INFO(again.ToString());
  CHECK(again.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(again.message()).find("timed out waiting for rank 2") != std::string::npos);
}

TEST_CASE("shm: Abort wakes a rank waiting in a collective and names the aborting rank", "[unit]") {
  Segment seg(2, 64);
  double v = 1;
  const auto t0 = ShmGroup::Clock::now();
  auto s = seg.Run([&](int r) -> absl::Status {
    if (r == 1) {
      std::this_thread::sleep_for(50ms);
      seg.rank(1).Abort();
      return absl::OkStatus();
    }
    return seg.rank(0).Allreduce(&v, 1, DType::kFloat64, ReduceOp::kSum, In(30s));
  });
  CHECK(ShmGroup::Clock::now() - t0 < 5s);
  INFO(s[0].ToString());
  CHECK(s[0].code() == absl::StatusCode::kAborted);
  CHECK(std::string(s[0].message()).find("rank 1 aborted") != std::string::npos);
}

TEST_CASE("host layout: hosts numbered by their lowest rank, members ascending", "[unit]") {
  using ddp::detail::LayoutFromIdentities;
  const std::vector<std::string> ids = {"b", "a", "b", "c", "a"};
  auto l = LayoutFromIdentities(ids, 2);
  CHECK(l.num_hosts == 3);
  CHECK(l.host == 0);
  CHECK(l.local == std::vector<int>{0, 2});
  CHECK(l.local_index == 1);
  CHECK(l.leaders == std::vector<int>{0, 1, 3});
  l = LayoutFromIdentities(ids, 3);
  CHECK(l.host == 2);
  CHECK(l.local == std::vector<int>{3});
  CHECK(l.local_index == 0);
  l = LayoutFromIdentities({"x", "x", "x"}, 1);
  CHECK(l.num_hosts == 1);
  CHECK(l.local == std::vector<int>{0, 1, 2});
  CHECK(l.local_index == 1);
}

TEST_CASE("shm: a rank that finishes a collective and aborts does not fail a slower peer",
          "[unit]") {
  // Rank 0 leaves the last barrier and aborts at once; rank 1, still waking
  // from that barrier, must complete its collective. Many rounds, because the
  // window is small.
  for (int round = 0; round < 200; ++round) {
    Segment seg(2, 64);
    float a = 1, b = 2;
    auto s = seg.Run([&](int r) -> absl::Status {
      float* x = r == 0 ? &a : &b;
      absl::Status st = seg.rank(r).Allreduce(x, 1, DType::kFloat32, ReduceOp::kSum, In(10s));
      if (r == 0) seg.rank(0).Abort();
      return st;
    });
    INFO("round " << round << ": " << s[1].ToString());
    REQUIRE(s[0].ok());
    REQUIRE(s[1].ok());
    REQUIRE(b == 3);
  }
}

TEST_CASE("shm allreduce of pieces: the same bits as the packed buffer", "[unit]") {
  using ddp::detail::ShmPiece;
  const int size = 3;
  // Uneven pieces, one empty, crossing 256-byte steps (64 floats) anywhere.
  const std::vector<std::size_t> lens = {5, 0, 130, 1, 64, 77};
  std::size_t total = 0;
  for (auto l : lens) total += l;
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.f, 10.f);
  std::vector<std::vector<float>> packed(size, std::vector<float>(total));
  for (auto& v : packed) {
    for (auto& x : v) x = d(gen);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    auto pieces_data = packed;  // split into separate vectors below
    std::vector<std::vector<std::vector<float>>> split(size);
    for (int r = 0; r < size; ++r) {
      std::size_t at = 0;
      for (auto l : lens) {
        split[r].emplace_back(packed[r].begin() + at, packed[r].begin() + at + l);
        at += l;
      }
    }
    Segment a(size, 256), b(size, 256);
    RequireAllOk(a.Run([&](int r) {
      return a.rank(r).Allreduce(pieces_data[r].data(), total, DType::kFloat32, op, In(10s));
    }));
    RequireAllOk(b.Run([&](int r) {
      std::vector<ShmPiece> pieces;
      for (auto& v : split[r]) pieces.push_back(ShmPiece{v.data(), v.size() * sizeof(float)});
      return b.rank(r).Allreduce(pieces, DType::kFloat32, op, In(10s));
    }));
    for (int r = 0; r < size; ++r) {
      std::vector<float> joined;
      for (auto& v : split[r]) joined.insert(joined.end(), v.begin(), v.end());
      INFO("rank " << r << " op " << int(op));
      REQUIRE(std::memcmp(joined.data(), pieces_data[0].data(), total * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("shm: ranks that issue different collectives get an error, not mixed data", "[unit]") {
  // Different sizes of one all-reduce.
  {
    Segment seg(2, 64);
    std::vector<float> a(10, 1.f), b(20, 2.f);
    auto s = seg.Run([&](int r) {
      auto& v = r == 0 ? a : b;
      return seg.rank(r).Allreduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, In(10s));
    });
    for (int r = 0; r < 2; ++r) {
      INFO(s[r].ToString());
      CHECK(s[r].code() == absl::StatusCode::kInvalidArgument);
      CHECK(std::string(s[r].message()).find("allreduce(10 x f32, sum)") != std::string::npos);
      CHECK(std::string(s[r].message()).find("allreduce(20 x f32, sum)") != std::string::npos);
    }
    CHECK(a[0] == 1.f);  // untouched: the check runs before any result is written
  }
  // A barrier against a broadcast, then the group refuses further calls.
  {
    Segment seg(3, 64);
    std::vector<char> buf(100);
    auto s = seg.Run([&](int r) -> absl::Status {
      if (r == 2) return seg.rank(r).Broadcast(buf.data(), buf.size(), 0, In(10s));
      return seg.rank(r).Barrier(In(10s));
    });
    for (int r = 0; r < 3; ++r) {
      INFO(s[r].ToString());
      CHECK(s[r].code() == absl::StatusCode::kInvalidArgument);
    }
    CHECK(std::string(s[2].message()).find("broadcast(100 bytes, root 0)") != std::string::npos);
    CHECK(seg.rank(0).Barrier(In(1s)).code() == absl::StatusCode::kInvalidArgument);
  }
}

namespace {
ddp::WorkerInfo Info(int rank, int world) {
  ddp::WorkerInfo info;
  info.rank = rank;
  info.world_size = world;
  info.job_id = "unit";
  return info;
}
}  // namespace

TEST_CASE("shm bootstrap through a store: two ranks map one segment and reduce", "[unit]") {
  ddprun::rendezvous::InMemoryStore store;
  std::vector<std::unique_ptr<ShmGroup>> groups(2);
  std::vector<std::string> why(2);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r) {
    t.emplace_back([&, r] {
      const auto layout = ddp::detail::LayoutFromIdentities({"h", "h"}, r);
      auto g = ddp::detail::ConnectShmGroup(layout, Info(r, 2), store, "pg/", 10s, 4096, &why[r]);
      if (g.ok()) groups[r] = std::move(*g);
    });
  }
  for (auto& x : t) x.join();
  REQUIRE(groups[0]);
  REQUIRE(groups[1]);
  double v[2] = {1.5, 2.25};
  std::vector<absl::Status> s(2);
  std::thread a(
      [&] { s[0] = groups[0]->Allreduce(&v[0], 1, DType::kFloat64, ReduceOp::kSum, In(10s)); });
  std::thread b(
      [&] { s[1] = groups[1]->Allreduce(&v[1], 1, DType::kFloat64, ReduceOp::kSum, In(10s)); });
  a.join();
  b.join();
  RequireAllOk(s);
  CHECK(v[0] == 3.75);
  CHECK(v[1] == 3.75);
}

TEST_CASE("shm bootstrap refuses a segment address that is not the host's segment", "[unit]") {
  // Rank 1 of 2 is given (as if rank 0 lived on another machine with the same
  // DDP_SHM_HOST_ID) the pid/fd of a file of this process that is not a segment.
  char path[] = "/tmp/ddprun-shm-test-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::unlink(path);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  ddprun::rendezvous::InMemoryStore store;
  REQUIRE(store
              .Set("pg/shm/host0/segment",
                   std::to_string(::getpid()) + "/" + std::to_string(fd) + "/12345")
              .ok());
  REQUIRE(store.Set("pg/shm/ok/0", "").ok());
  std::string why;
  const auto layout = ddp::detail::LayoutFromIdentities({"h", "h"}, 1);
  auto g = ddp::detail::ConnectShmGroup(layout, Info(1, 2), store, "pg/", 5s, 4096, &why);
  ::close(fd);
  REQUIRE(g.ok());
  CHECK(*g == nullptr);
  INFO(why);
  CHECK(why.find("rank 1") != std::string::npos);
  CHECK(why.find("is not the host's segment") != std::string::npos);
  CHECK(why.find("DDP_SHM_HOST_ID") != std::string::npos);
}

TEST_CASE("shm small allreduce: posted by one thread, completed by another, same bits", "[unit]") {
  // Rank 0 posts before the others and sees that they are not there; a second
  // thread completes its all-reduce (what CallerRuns hands the communication
  // thread), while ranks 1 and 2 run plain Allreduce calls.
  const int size = 3;
  const std::size_t n = 10;  // 40 bytes: the one-barrier path (64-byte steps)
  Segment seg(size, 64);
  REQUIRE(n * sizeof(float) <= seg.rank(0).small_allreduce_bytes());
  std::vector<std::vector<float>> data(size, std::vector<float>(n));
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) data[r][i] = Value<float>(r, i);
  }
  ShmGroup::Posted posted;
  REQUIRE(
      seg.rank(0).PostAllreduce(data[0].data(), n, DType::kFloat32, ReduceOp::kSum, &posted).ok());
  // Posting read the input: changing it now does not change the result.
  std::vector<float> input = data[0];
  std::fill(data[0].begin(), data[0].end(), 1000.0f);
  CHECK_FALSE(
      seg.rank(0).Arrived(posted, std::chrono::microseconds(1), std::chrono::microseconds(2)));
  RequireAllOk(seg.Run([&](int r) -> absl::Status {
    if (r == 0) return seg.rank(0).Complete(posted, data[0].data(), In(10s));
    return seg.rank(r).Allreduce(data[r].data(), n, DType::kFloat32, ReduceOp::kSum, In(10s));
  }));
  CHECK(seg.rank(0).Arrived(posted, std::chrono::microseconds(0), std::chrono::microseconds(0)));
  const auto want = Reference<float>(size, n, ReduceOp::kSum);
  for (int r = 0; r < size; ++r) REQUIRE(data[r] == want);
  // A split barrier, and the group goes on with the two-barrier path.
  ShmGroup::Posted b;
  REQUIRE(seg.rank(1).PostBarrier(&b).ok());
  RequireAllOk(seg.Run([&](int r) -> absl::Status {
    if (r == 1) return seg.rank(1).Complete(b, nullptr, In(10s));
    return seg.rank(r).Barrier(In(10s));
  }));
  std::vector<std::vector<double>> big(size, std::vector<double>(100, 1.0));
  RequireAllOk(seg.Run([&](int r) {
    return seg.rank(r).Allreduce(big[r].data(), 100, DType::kFloat64, ReduceOp::kAvg, In(10s));
  }));
  for (int r = 0; r < size; ++r) REQUIRE(big[r] == std::vector<double>(100, 1.0));
}

// ---- The direct path: every rank's buffer in shareable memory ----

namespace {

using ddp::detail::AllocShared;
using ddp::detail::FreeShared;

// A shareable buffer of n T's (shared_buffers.h), freed at scope end.
template <class T>
struct SharedVec {
  explicit SharedVec(std::size_t n, std::size_t pad = 0) : n(n), pad(pad) {
    auto p = AllocShared((n + pad) * sizeof(T));
    REQUIRE(p.ok());
    base = static_cast<T*>(*p);
  }
  ~SharedVec() { REQUIRE(FreeShared(base)); }
  T* data() { return base + pad; }
  std::size_t n, pad;
  T* base;
};

// Runs one all-reduce of `in` (per rank) with heap buffers (the staged path)
// and with shareable ones at per-rank offsets (the direct path); every rank's
// result must be the same bits on both paths.
template <class T>
void CheckDirectSameBits(int size, const std::vector<std::vector<T>>& in, DType dt, ReduceOp op,
                         std::size_t chunk) {
  const std::size_t n = in[0].size();
  auto heap = in;
  Segment a(size, chunk), b(size, chunk);
  RequireAllOk(
      a.Run([&](int r) { return a.rank(r).Allreduce(heap[r].data(), n, dt, op, In(10s)); }));
  std::vector<std::unique_ptr<SharedVec<T>>> shared;
  for (int r = 0; r < size; ++r) {
    shared.push_back(std::make_unique<SharedVec<T>>(n, /*pad=*/3 * r));
    std::copy(in[r].begin(), in[r].end(), shared[r]->data());
  }
  RequireAllOk(
      b.Run([&](int r) { return b.rank(r).Allreduce(shared[r]->data(), n, dt, op, In(10s)); }));
  for (int r = 0; r < size; ++r) {
    INFO("size " << size << " n " << n << " rank " << r << " op " << int(op) << " dtype "
                 << int(dt));
    CHECK(a.rank(r).direct_allreduces() == 0);
    // Above the one-barrier size shareable buffers take the direct path (one
    // rank too).
    CHECK(b.rank(r).direct_allreduces() ==
          (n * sizeof(T) > b.rank(r).small_allreduce_bytes() ? 1u : 0u));
    REQUIRE(std::memcmp(shared[r]->data(), heap[r].data(), n * sizeof(T)) == 0);
  }
}

}  // namespace

TEST_CASE("shm allreduce, direct path: every op and dtype, 1-4 ranks, the staged path's bits",
          "[unit]") {
  std::mt19937 gen(11);
  std::normal_distribution<float> d(0.f, 100.f);
  // 64-byte steps (small_ 64 bytes) for the short ones; 70001 elements cross
  // the direct path's 64 KiB fold pieces at any width (4 KiB steps there, so
  // that the staged reference stays quick).
  for (int size = 1; size <= 4; ++size) {
    for (std::size_t n : {17, 100, 70001}) {
      const std::size_t chunk = n > 1000 ? 4096 : 64;
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<std::vector<float>> f(size, std::vector<float>(n));
        std::vector<std::vector<double>> g(size, std::vector<double>(n));
        std::vector<std::vector<std::int32_t>> i32(size, std::vector<std::int32_t>(n));
        std::vector<std::vector<std::int64_t>> i64(size, std::vector<std::int64_t>(n));
        std::vector<std::vector<std::uint16_t>> h(size, std::vector<std::uint16_t>(n));
        std::vector<std::vector<std::uint16_t>> bf(size, std::vector<std::uint16_t>(n));
        for (int r = 0; r < size; ++r) {
          for (std::size_t i = 0; i < n; ++i) {
            const float x = d(gen);
            f[r][i] = x;
            g[r][i] = double(x) * 1.000001;
            i32[r][i] = static_cast<std::int32_t>(x * 1000);
            i64[r][i] = static_cast<std::int64_t>(x * 1e6);
            h[r][i] = ddp::detail::FloatToFloat16(x);
            bf[r][i] = ddp::detail::FloatToBFloat16(x);
          }
        }
        CheckDirectSameBits(size, f, DType::kFloat32, op, chunk);
        CheckDirectSameBits(size, g, DType::kFloat64, op, chunk);
        CheckDirectSameBits(size, i32, DType::kInt32, op, chunk);
        CheckDirectSameBits(size, i64, DType::kInt64, op, chunk);
        CheckDirectSameBits(size, h, DType::kFloat16, op, chunk);
        CheckDirectSameBits(size, bf, DType::kBFloat16, op, chunk);
      }
    }
  }
}

TEST_CASE("shm allreduce: shareable and heap buffers mixed across ranks take the staged path",
          "[unit]") {
  const int size = 3;
  const std::size_t n = 1000;  // 64-byte steps: many staged steps
  Segment seg(size, 64);
  SharedVec<float> s0(n), s2(n);
  std::vector<float> heap1(n);
  std::vector<float*> buf = {s0.data(), heap1.data(), s2.data()};
  for (int rep = 0; rep < 3; ++rep) {
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < n; ++i) buf[r][i] = Value<float>(r, i) + float(rep);
    }
    RequireAllOk(seg.Run([&](int r) {
      return seg.rank(r).Allreduce(buf[r], n, DType::kFloat32, ReduceOp::kSum, In(10s));
    }));
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        INFO("rep " << rep << " rank " << r << " element " << i);
        REQUIRE(buf[r][i] ==
                Value<float>(0, i) + Value<float>(1, i) + Value<float>(2, i) + 3.0f * float(rep));
      }
      CHECK(seg.rank(r).direct_allreduces() == 0);
    }
  }
}

TEST_CASE("shm allreduce, direct path: buffers freed and allocated again between calls", "[unit]") {
  // A peer's freed buffer's fd is reused by its next one: the stale mapping
  // must not be read (each rank would then see the old buffer's values).
  const int size = 2;
  const std::size_t n = 5000;
  Segment seg(size, 256);
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<std::unique_ptr<SharedVec<std::int32_t>>> v;
    for (int r = 0; r < size; ++r) {
      v.push_back(std::make_unique<SharedVec<std::int32_t>>(n + 100 * rep));
      for (std::size_t i = 0; i < n; ++i) v[r]->data()[i] = Value<std::int32_t>(r, i) + rep;
    }
    RequireAllOk(seg.Run([&](int r) {
      return seg.rank(r).Allreduce(v[r]->data(), n, DType::kInt32, ReduceOp::kSum, In(10s));
    }));
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < n; i += 37) {
        REQUIRE(v[r]->data()[i] == Value<std::int32_t>(0, i) + Value<std::int32_t>(1, i) + 2 * rep);
      }
      CHECK(seg.rank(r).direct_allreduces() == std::uint64_t(rep + 1));
    }
  }
}
