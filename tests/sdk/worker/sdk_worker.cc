// The rank side of the [sdk] tier: a Catch2 program that every rank of a
// ddprun job runs with the same test filter, so every rank issues the same
// collectives in the same order. tests/sdk/sdk_test.cc starts it under the
// real ddprun with 1-4 ranks. A failed check on one rank makes the others
// time out (DDP_TIMEOUT_SEC is short there), so a failure never hangs.
//
// The group is created once per process (ddp::Init is per round).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/half.h"
#include "support/sdk_values.h"

namespace {

using ddp::DType;
using ddp::ReduceOp;
using ddp::detail::BFloat16ToFloat;
using ddp::detail::Float16ToFloat;
using ddp::detail::FloatToBFloat16;
using ddp::detail::FloatToFloat16;

std::shared_ptr<ddp::ProcessGroup>& Group() {
  static std::shared_ptr<ddp::ProcessGroup> pg = ddp::Init();
  return pg;
}

using ddprun::test::IsInt;
using ddprun::test::Value;
using Buf = ddprun::test::TypedBuf;

double Reference(ReduceOp op, DType dtype, int world, std::size_t i, std::uint64_t salt) {
  double acc = Value(0, i, dtype, salt);
  for (int r = 1; r < world; ++r) {
    const double v = Value(r, i, dtype, salt);
    if (op == ReduceOp::kMax)
      acc = std::max(acc, v);
    else if (op == ReduceOp::kMin)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op == ReduceOp::kAvg) {
    if (IsInt(dtype)) return double(std::int64_t(acc) / world);  // truncation
    return acc / world;
  }
  return acc;
}

void CheckClose(double got, double want, DType dtype, std::size_t i) {
  INFO("element " << i << " dtype " << ddp::DTypeName(dtype));
  if (IsInt(dtype)) {
    REQUIRE(got == want);
  } else {
    // f32 sums of several ranks may be added in a different order than here.
    const double tol = dtype == DType::kFloat64   ? 1e-12
                       : dtype == DType::kFloat32 ? 1e-6
                       : dtype == DType::kFloat16 ? 1e-3
                                                  : 8e-3;
    REQUIRE(std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want)));
  }
}

using ddprun::test::kDTypes;
using ddprun::test::kOps;
// Zero, one, uneven (not a multiple of any world size), and above Gloo's 1 MiB segment.
const std::vector<std::size_t> kSizes = {0, 1, 7, 1001, 300007};

}  // namespace

TEST_CASE("allreduce: every dtype and op against a local reference", "[collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  std::uint64_t salt = 1;
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t n : kSizes) {
        INFO(ddp::DTypeName(dtype) << " " << ddp::ReduceOpName(op) << " n=" << n);
        Buf b(dtype, n);
        for (std::size_t i = 0; i < n; ++i) b.Set(i, Value(rank, i, dtype, salt));
        pg->Allreduce(b.data(), n, dtype, op).Wait();
        for (std::size_t i = 0; i < n; ++i) {
          double want = Reference(op, dtype, world, i, salt);
          if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
            // The SDK averages in the element type: round like it does.
            Buf r(dtype, 1);
            r.Set(0, want);
            want = r.Get(0);
          }
          CheckClose(b.Get(i), want, dtype, i);
        }
        ++salt;
      }
    }
  }
}

TEST_CASE("allreduce: many in flight complete in issue order", "[collectives]") {
  auto& pg = Group();
  const int world = pg->size();
  std::vector<std::vector<std::int64_t>> bufs(16, std::vector<std::int64_t>(1000));
  std::vector<ddp::Work> works;
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    for (std::size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = std::int64_t(k * 1000 + i);
    works.push_back(pg->Allreduce(std::span<std::int64_t>(bufs[k])));
  }
  for (auto& w : works) w.Wait();
  for (std::size_t k = 0; k < bufs.size(); ++k)
    for (std::size_t i = 0; i < bufs[k].size(); i += 97)
      REQUIRE(bufs[k][i] == std::int64_t(k * 1000 + i) * world);
}

TEST_CASE("broadcast from every root", "[collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (int root = 0; root < world; ++root) {
    for (DType dtype : kDTypes) {
      for (std::size_t n : kSizes) {
        Buf b(dtype, n);
        for (std::size_t i = 0; i < n; ++i) b.Set(i, Value(rank, i, dtype, 77));
        pg->Broadcast(b.data(), n, dtype, root).Wait();
        for (std::size_t i = 0; i < n; ++i) {
          Buf r(dtype, 1);
          r.Set(0, Value(root, i, dtype, 77));
          INFO("root " << root << " " << ddp::DTypeName(dtype) << " n=" << n << " i=" << i);
          REQUIRE(b.Get(i) == r.Get(0));
        }
      }
    }
  }
}

// Replicas must not drift: every rank ends an allreduce with the same bits,
// also for values whose sum depends on the order of addition.
TEST_CASE("after Init, SIGPIPE is ignored: a dead peer is an error, not a signal",
          "[collectives]") {
  Group();
  struct sigaction sa {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &sa) == 0);
  REQUIRE(sa.sa_handler == SIG_IGN);
}

TEST_CASE("allreduce results are bit-identical on every rank (f32 sum)", "[collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (std::size_t n :
       {std::size_t(1), std::size_t(1000), std::size_t(16384), std::size_t(300007)}) {
    INFO("n=" << n);
    std::vector<float> v(n);
    std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(rank + 1);
    for (auto& f : v) {
      x = x * 1664525u + 1013904223u;
      f = static_cast<float>(static_cast<std::int32_t>(x)) * 1.2345e-7f;  // not exactly summable
    }
    pg->Allreduce(std::span<float>(v)).Wait();
    std::vector<float> all(n * world);
    pg->Allgather(v.data(), all.data(), n, ddp::DType::kFloat32).Wait();
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << " vs rank " << rank);
      REQUIRE(std::memcmp(all.data() + r * n, v.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("allgather and reduce_scatter", "[collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (DType dtype : kDTypes) {
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(13), std::size_t(40001)}) {
      INFO(ddp::DTypeName(dtype) << " n=" << n);
      Buf in(dtype, n), out(dtype, n * world);
      for (std::size_t i = 0; i < n; ++i) in.Set(i, Value(rank, i, dtype, 5));
      pg->Allgather(in.data(), out.data(), n, dtype).Wait();
      for (int r = 0; r < world; ++r)
        for (std::size_t i = 0; i < n; ++i) {
          Buf want(dtype, 1);
          want.Set(0, Value(r, i, dtype, 5));
          REQUIRE(out.Get(r * n + i) == want.Get(0));
        }

      for (ReduceOp op : kOps) {
        Buf rin(dtype, n * world), rout(dtype, n);
        for (std::size_t i = 0; i < n * world; ++i) rin.Set(i, Value(rank, i, dtype, 9));
        pg->ReduceScatter(rin.data(), rout.data(), n, dtype, op).Wait();
        for (std::size_t i = 0; i < n; ++i) {
          double want = Reference(op, dtype, world, rank * n + i, 9);
          Buf r(dtype, 1);
          r.Set(0, want);
          CheckClose(rout.Get(i), r.Get(0), dtype, i);
        }
      }
    }
  }
}

TEST_CASE("barrier holds every rank until the last arrives", "[collectives]") {
  auto& pg = Group();
  // Rank 0 arrives 300 ms late; nobody may leave before it arrived.
  const auto t0 = std::chrono::steady_clock::now();
  pg->Barrier().Wait();  // align
  const auto t1 = std::chrono::steady_clock::now();
  if (pg->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pg->Barrier().Wait();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  (void)t0;
  if (pg->size() > 1) REQUIRE(waited >= 0.25);
}

// ---- Reducer ----

namespace {

// A fake model: tensors of uneven sizes, gradients g[k][i] from (rank, k, i, step).
struct FakeGrads {
  std::vector<std::vector<float>> g;
  explicit FakeGrads(const std::vector<std::size_t>& sizes) {
    for (std::size_t s : sizes) g.emplace_back(s);
  }
  void Fill(int rank, int step, bool dyadic) {
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) {
        double v = Value(rank, i + 1000003 * k, DType::kFloat32, step);
        g[k][i] = dyadic ? float(v) : float(v * 0.7310585786300049);
      }
  }
};

const std::vector<std::size_t> kModel = {1000, 7, 250000, 3, 70000, 1, 300001, 64};

}  // namespace

TEST_CASE("reducer: bucketed equals per-tensor allreduce bit for bit (f32 sum)", "[reducer]") {
  auto& pg = Group();
  // Two ranks add in either order with the same result; with more ranks the
  // ring's order depends on an element's offset, so use exactly summable values.
  const bool dyadic = pg->size() > 2;
  FakeGrads bucketed(kModel), plain(kModel);
  ddp::ReducerOptions opts;
  opts.average = false;
  opts.bucket_cap_bytes = 512 * 1024;
  opts.first_bucket_bytes = 16 * 1024;
  ddp::Reducer reducer(pg, opts);
  for (auto& t : bucketed.g) reducer.Register(std::span<float>(t));
  for (int step = 0; step < 3; ++step) {
    bucketed.Fill(pg->rank(), step, dyadic);
    plain.Fill(pg->rank(), step, dyadic);
    for (std::size_t k = kModel.size(); k-- > 0;) reducer.MarkReady(k);  // backward order
    reducer.Finish();
    std::vector<ddp::Work> w;
    for (auto& t : plain.g) w.push_back(pg->Allreduce(std::span<float>(t)));
    for (auto& x : w) x.Wait();
    for (std::size_t k = 0; k < kModel.size(); ++k)
      REQUIRE(std::memcmp(bucketed.g[k].data(), plain.g[k].data(), kModel[k] * 4) == 0);
  }
  REQUIRE(reducer.num_buckets() > 2);
  REQUIRE(reducer.num_steps() == 3);
  // Per-bucket timing of the last step: every bucket, every byte, ready
  // before issued.
  const auto stats = reducer.last_step_stats();
  REQUIRE(stats.size() == reducer.num_buckets());
  std::size_t bytes = 0;
  for (const auto& st : stats) {
    bytes += st.wire_bytes;
    REQUIRE(st.issue.count() >= 0);
    REQUIRE(st.ready_to_launch >= st.issue);
  }
  std::size_t want_bytes = 0;
  for (std::size_t s : kModel) want_bytes += s * 4;
  REQUIRE(bytes == want_bytes);
}

TEST_CASE("reducer: averages; out-of-order MarkReady; gradient as bucket view", "[reducer]") {
  auto& pg = Group();
  const int world = pg->size();
  for (bool view : {false, true}) {
    INFO("gradient_as_bucket_view=" << view);
    FakeGrads grads(kModel);
    ddp::ReducerOptions opts;
    opts.gradient_as_bucket_view = view;
    opts.bucket_cap_bytes = 256 * 1024;
    ddp::Reducer reducer(pg, opts);
    for (auto& t : grads.g) reducer.Register(std::span<float>(t));
    std::vector<float*> where;
    for (std::size_t k = 0; k < kModel.size(); ++k)
      where.push_back(static_cast<float*>(reducer.GradientBuffer(k)));
    if (!view) REQUIRE(where[0] == grads.g[0].data());
    if (view) REQUIRE(where[0] != grads.g[0].data());
    for (int step = 0; step < 2; ++step) {
      grads.Fill(pg->rank(), step, true);
      for (std::size_t k = 0; k < kModel.size(); ++k)
        std::memcpy(where[k], grads.g[k].data(), kModel[k] * 4);
      // Registration order, not backward order: buckets still launch in order.
      for (std::size_t k = 0; k < kModel.size(); ++k) reducer.MarkReady(k);
      reducer.Finish();
      for (std::size_t k = 0; k < kModel.size(); ++k)
        for (std::size_t i = 0; i < kModel[k]; i += 101) {
          double want = 0;
          for (int r = 0; r < world; ++r) want += Value(r, i + 1000003 * k, DType::kFloat32, step);
          REQUIRE(where[k][i] == Approx(want / world).margin(1e-6));
        }
    }
  }
}

TEST_CASE("reducer: no_sync accumulates locally, the next step syncs the sum", "[reducer]") {
  auto& pg = Group();
  const int world = pg->size();
  std::vector<float> g(5000, 0.0f);
  ddp::Reducer reducer(pg);
  reducer.Register(std::span<float>(g));
  // Three micro-batches: two inside NoSync, one outside; the trainer accumulates.
  for (int micro = 0; micro < 3; ++micro) {
    auto add = [&] {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] += float(pg->rank() + micro + 1);
    };
    if (micro < 2) {
      auto guard = reducer.NoSync();
      add();
      reducer.MarkReady(0);
      reducer.Finish();
      REQUIRE(g[0] == float((micro + 1) * (pg->rank() + 1) + micro * (micro + 1) / 2));
    } else {
      add();
      reducer.MarkReady(0);
      reducer.Finish();
    }
  }
  // Rank r accumulated 3(r+1) + 3; the mean over ranks.
  double want = 0;
  for (int r = 0; r < world; ++r) want += 3.0 * (r + 1) + 3.0;
  REQUIRE(g[0] == Approx(want / world));
  REQUIRE(g[4999] == Approx(want / world));
  REQUIRE(reducer.num_steps() == 1);
}

TEST_CASE("reducer: f16 and bf16 compression stay within their error bounds", "[reducer]") {
  auto& pg = Group();
  const int world = pg->size();
  for (auto c : {ddp::Compression::kFloat16, ddp::Compression::kBFloat16}) {
    std::vector<float> g(100000);
    ddp::ReducerOptions opts;
    opts.compression = c;
    ddp::Reducer reducer(pg, opts);
    reducer.Register(std::span<float>(g));
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = float(Value(pg->rank(), i, DType::kFloat32, 3) / 1000.0);
    reducer.MarkReady(0);
    reducer.Finish();
    // Unit roundoff u = 2^-11 (f16) or 2^-8 (bf16): each of the `world`
    // inputs is rounded once and each of the world-1 partial sums once.
    const double u = c == ddp::Compression::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    double worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      double exact = 0, mag = 0;
      for (int r = 0; r < world; ++r) {
        const double v = Value(r, i, DType::kFloat32, 3) / 1000.0 / world;
        exact += v;
        mag += std::fabs(v);
      }
      const double bound = 2.0 * world * u * mag + 6e-8;  // + f16 subnormal spacing
      const double err = std::fabs(double(g[i]) - exact);
      worst = std::max(worst, err / bound);
      REQUIRE(err <= bound);
    }
    WARN(ddp::DTypeName(c == ddp::Compression::kFloat16 ? DType::kFloat16 : DType::kBFloat16)
         << " compression: worst error " << worst << " of its bound");
  }
}

TEST_CASE("reducer: broadcast of initial parameters from rank 0", "[reducer]") {
  auto& pg = Group();
  std::vector<float> w1(1000);
  std::vector<double> w2(33);
  std::vector<std::int64_t> w3(5);
  for (auto& x : w1) x = float(pg->rank() + 1);
  for (auto& x : w2) x = pg->rank() * 2.5;
  for (auto& x : w3) x = pg->rank() - 7;
  ddp::BroadcastParameters(*pg, {{w1.data(), w1.size(), DType::kFloat32, {}},
                                 {w2.data(), w2.size(), DType::kFloat64, {}},
                                 {w3.data(), w3.size(), DType::kInt64, {}}});
  REQUIRE(w1[999] == 1.0f);
  REQUIRE(w2[32] == 0.0);
  REQUIRE(w3[4] == -7);
}

TEST_CASE("reducer: register after the first step is refused", "[reducer]") {
  auto& pg = Group();
  std::vector<float> a(10), b(10);
  ddp::Reducer reducer(pg);
  reducer.Register(std::span<float>(a));
  reducer.MarkReady(0);
  reducer.Finish();
  REQUIRE_THROWS_AS(reducer.Register(std::span<float>(b)), ddp::StateError);
  REQUIRE_THROWS_AS(reducer.MarkReady(1), ddp::InvalidArgumentError);
  reducer.MarkReady(0);
  REQUIRE_THROWS_WITH(reducer.MarkReady(0), Catch::Contains("twice"));
  reducer.Finish();
}

TEST_CASE("reducer: mismatched gradients across ranks name the first differing one", "[reducer]") {
  auto& pg = Group();
  if (pg->size() == 1) return;
  std::vector<float> a(100), b(pg->rank() == 1 ? 200 : 100), c(5);
  ddp::Reducer reducer(pg);
  reducer.Register(std::span<float>(a));
  reducer.Register(std::span<float>(b));
  reducer.Register(std::span<float>(c));
  try {
    reducer.MarkReady(2);
    FAIL("no error");
  } catch (const ddp::InvalidArgumentError& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("gradient 1") != std::string::npos);
    REQUIRE(msg.find("rank 0 has 100 x f32") != std::string::npos);
    REQUIRE(msg.find("rank 1 has 200 x f32") != std::string::npos);
  }
  // The reducer is unusable now; the group is not.
  REQUIRE_THROWS_AS(reducer.Finish(), ddp::StateError);
  pg->Barrier().Wait();
}

// ---- bad input ----

TEST_CASE("bad input: null pointer, wrong dtype, bad root", "[bad-input]") {
  auto& pg = Group();
  REQUIRE_THROWS_AS(pg->Allreduce(nullptr, 10, DType::kFloat32), ddp::InvalidArgumentError);
  float x = 1;
  REQUIRE_THROWS_WITH(pg->Allreduce(&x, 1, static_cast<DType>(42)),
                      Catch::Contains("invalid dtype 42"));
  REQUIRE_THROWS_AS(pg->Allreduce(&x, 1, DType::kFloat32, static_cast<ReduceOp>(9)),
                    ddp::InvalidArgumentError);
  REQUIRE_THROWS_WITH(pg->Broadcast(&x, 1, DType::kFloat32, pg->size()),
                      Catch::Contains("not a rank"));
  // Zero elements at a null pointer is fine.
  pg->Allreduce(nullptr, 0, DType::kFloat32).Wait();
  pg->Barrier().Wait();
}

TEST_CASE("bad input: a second group, aborted, refuses every call", "[bad-input]") {
  auto pg2 = ddp::Init();
  float x = 1;
  pg2->Allreduce(&x, 1, DType::kFloat32).Wait();
  REQUIRE(x == float(pg2->size()));
  pg2->Abort("test abort");
  REQUIRE(pg2->aborted());
  REQUIRE_THROWS_AS(pg2->Allreduce(&x, 1, DType::kFloat32), ddp::StateError);
  REQUIRE_THROWS_WITH(pg2->Barrier(), Catch::Contains("test abort"));
  Group()->Barrier().Wait();  // the first group is untouched
}

// ---- failures (run alone: they end the job) ----

namespace {
void WriteResult(const std::string& text) {
  if (const char* path = std::getenv("SDK_RESULT_FILE")) {
    std::ofstream(std::string(path) + "." + std::to_string(Group()->rank())) << text << "\n";
  }
}

// "code=<name> seconds=<since t0> what=<message>", what the [sdk] cases parse.
std::string ErrorReport(const ddp::Error& e, std::chrono::steady_clock::time_point t0) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::string("code=") + ddp::ErrorCodeName(e.code()) + " seconds=" + std::to_string(s) +
         " what=" + e.what();
}

// All-reduces v, reports how it failed (or "no error"), and ends the job's
// worker with status 3: the failure cases' common tail.
[[noreturn]] void ReportAllreduceAndExit(std::vector<float>& v) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Group()->Allreduce(std::span<float>(v)).Wait();
    WriteResult("no error");
  } catch (const ddp::Error& e) {
    WriteResult(ErrorReport(e, t0));
  }
  std::_Exit(3);
}
}  // namespace

TEST_CASE("a peer killed mid-collective is an error within the timeout", "[kill]") {
  ::signal(SIGTERM, SIG_IGN);  // outlive the agent's stop long enough to report
  auto& pg = Group();
  REQUIRE(pg->size() >= 2);
  // SDK_KILL_COUNT: the size of the collective the peer dies in (default
  // 16 Mi floats; a small one takes the latency paths).
  const char* count = std::getenv("SDK_KILL_COUNT");
  std::vector<float> big(count ? std::stoul(count) : std::size_t(16) << 20);
  pg->Allreduce(std::span<float>(big)).Wait();  // everyone is connected
  // Rank 1 must not die while a slower rank is still in the warm-up above
  // (its error would then escape the try below): once the barrier returns on
  // rank 1, every rank has finished the warm-up.
  pg->Barrier().Wait();
  if (pg->rank() == 1) {
    auto w = pg->Allreduce(std::span<float>(big));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(::getpid(), SIGKILL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100; ++i) pg->Allreduce(std::span<float>(big)).Wait();
    WriteResult("no error");
  } catch (const ddp::Error& e) {
    const std::string report = ErrorReport(e, t0);
    WriteResult(report);
    // Later calls fail fast, naming the first failure.
    try {
      pg->Barrier().Wait();
    } catch (const ddp::StateError& e2) {
      WriteResult(report + "\nthen=" + e2.what());
    }
  }
  std::_Exit(3);
}

// Nanoseconds of the machine's monotonic clock (steady_clock is
// CLOCK_MONOTONIC: the same clock in every process of the host).
std::int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST_CASE("survivors of a peer killed with SIGKILL get PeerLostError at once", "[peer-lost]") {
  // Every rank all-reduces SDK_KILL_COUNT floats in a loop; rank
  // SDK_VICTIM writes the monotonic time to SDK_RESULT_FILE.killed and
  // SIGKILLs itself after 50 iterations. Every survivor reports its error,
  // the rank it names, and the time from the kill to the error.
  ::signal(SIGTERM, SIG_IGN);  // outlive the agent's stop long enough to report
  auto& pg = Group();
  REQUIRE(pg->size() >= 3);
  const char* count = std::getenv("SDK_KILL_COUNT");
  const char* victim_text = std::getenv("SDK_VICTIM");
  const int victim = victim_text ? std::atoi(victim_text) : 2;
  const std::string killed_file = std::string(std::getenv("SDK_RESULT_FILE")) + ".killed";
  std::vector<float> v(count ? std::stoul(count) : 1024, 1.0f);
  pg->Allreduce(std::span<float>(v)).Wait();
  pg->Barrier().Wait();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60); ++i) {
      if (pg->rank() == victim && i == 50) {
        std::ofstream(killed_file) << MonotonicNs() << "\n";
        ::kill(::getpid(), SIGKILL);
      }
      pg->Allreduce(std::span<float>(v)).Wait();
    }
    WriteResult("no error");
  } catch (const ddp::PeerLostError& e) {
    const std::int64_t now = MonotonicNs();
    std::int64_t killed = 0;
    std::ifstream(killed_file) >> killed;
    WriteResult(ErrorReport(e, t0) + "\nlost_rank=" + std::to_string(e.rank()) +
                "\nlatency_ms=" + std::to_string((now - killed) / 1e6));
  } catch (const ddp::Error& e) {
    WriteResult(ErrorReport(e, t0));
  }
  std::_Exit(3);
}

TEST_CASE("survivors re-form in place with ddp::Reconfigure; a replacement joins with Init",
          "[reform]") {
  // tests/sdk/reform_sdk_test.cc plays the agent (the in-place control
  // block). Round 0: every rank all-reduces in a loop (after writing
  // <SDK_RESULT_FILE>.ready.<rank>) until a peer is lost; then Reconfigure.
  // A replacement starts in round 1 directly. In round 1 every rank
  // all-reduces rank + 1 and reports pid, round, rank and the sum.
  const std::string out = std::getenv("SDK_RESULT_FILE");
  std::string lost = "none";
  if (Group()->info().round == 0) {
    std::ofstream(out + ".ready." + std::to_string(Group()->rank())) << ::getpid() << "\n";
    std::vector<float> v(1024, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
        Group()->Allreduce(std::span<float>(v)).Wait();
      }
      FAIL("no peer was lost within 60 s");
    } catch (const ddp::PeerLostError& e) {
      std::int64_t killed = 0;
      std::ifstream(out + ".killed") >> killed;
      lost =
          std::to_string(e.rank()) + " lost_ms=" + std::to_string((MonotonicNs() - killed) / 1e6);
    }
    auto broken = std::move(Group());
    Group() = ddp::Reconfigure(std::move(broken));
  }
  auto& pg = Group();
  std::vector<float> x(1000, static_cast<float>(pg->rank() + 1));
  pg->Allreduce(std::span<float>(x)).Wait();
  std::ofstream(out + "." + std::to_string(pg->rank()))
      << "pid=" << ::getpid() << " round=" << pg->info().round << " size=" << pg->size()
      << " sum=" << x[0] << " lost=" << lost << "\n";
  pg->Barrier().Wait();
}

TEST_CASE("a hung peer is a timeout error", "[hang]") {
  ::signal(SIGTERM, SIG_IGN);
  auto& pg = Group();
  REQUIRE(pg->size() >= 2);
  std::vector<float> v(1000);
  pg->Allreduce(std::span<float>(v)).Wait();
  if (pg->rank() == 1) ::raise(SIGSTOP);  // the agent SIGKILLs it at the end
  ReportAllreduceAndExit(v);
}

TEST_CASE("a wrong token is refused with an auth error", "[wrong-token]") {
  ::setenv("DDPRUN_TOKEN", "not-the-token", 1);
  try {
    ddp::Init();
    FAIL("Init accepted a wrong token");
  } catch (const ddp::AuthError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("DDPRUN_TOKEN") != std::string::npos);
  }
}

TEST_CASE("after a restart, Init bootstraps the new round's communicator", "[restart]") {
  // Round 0: every rank initialises and all-reduces, then rank 1 fails; the
  // agent restarts the job (--max_restarts). Round 1 must bootstrap from its
  // own keys (never round 0's segment, Gloo addresses or unique id) and work.
  auto& pg = Group();
  const std::int64_t round = pg->info().round;
  std::vector<float> v(4096, 1.0f);
  pg->Allreduce(std::span<float>(v)).Wait();
  REQUIRE(v[0] == float(pg->size()));
  if (round == 0) {
    pg->Barrier().Wait();
    if (pg->rank() == 1) std::_Exit(7);
    // The others wait for the agent to stop them for the restart.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    FAIL("round 0 was not restarted");
  }
  REQUIRE(round >= 1);
  std::vector<double> w(1 << 20, double(pg->rank()));
  pg->Allreduce(w.data(), w.size(), DType::kFloat64, ReduceOp::kMax).Wait();
  REQUIRE(w.back() == double(pg->size() - 1));
  WriteResult("round=" + std::to_string(round));
}

TEST_CASE("ranks that all-reduce different sizes get an error, not mixed data", "[mismatch]") {
  ::signal(SIGTERM, SIG_IGN);
  auto& pg = Group();
  std::vector<float> v(1000 + 24 * pg->rank(), 1.0f);
  ReportAllreduceAndExit(v);
}

TEST_CASE("store failover: groups bootstrap again and again while a replica dies", "[failover]") {
  // tests/sdk/ha_store_test.cc kills the leading ddprund replica while every
  // rank runs this loop: each ddp::Init is a new group whose bootstrap goes
  // through the store (the hello key, Gloo's addresses with DDP_SHM=0: set,
  // get and wait), so some of them meet the kill. Each must go on through the
  // next replica (DDPRUN_STORE_REPLICAS) and give the right sums.
  const char* n = std::getenv("FAILOVER_ITERATIONS");
  const int iterations = n != nullptr ? std::atoi(n) : 20;
  const char* progress = std::getenv("FAILOVER_PROGRESS_DIR");
  int rank = -1;
  for (int i = 0; i < iterations; ++i) {
    auto pg = ddp::Init();
    rank = pg->rank();
    const int w = pg->size();
    std::vector<float> v{float(rank + 1), float(i)};
    pg->Allreduce(std::span<float>(v)).Wait();
    REQUIRE(v[0] == float(w * (w + 1) / 2));
    REQUIRE(v[1] == float(w * i));
    if (progress != nullptr && i == 1) {
      std::ofstream(std::string(progress) + "/started." + std::to_string(rank)) << i << "\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (progress != nullptr) {
    std::ofstream(std::string(progress) + "/done." + std::to_string(rank)) << iterations << "\n";
  }
}

// ---- Which store (docs/sdk.md, "Which store"); tests/sdk/tcp_store_test.cc ----

namespace {

// Waits up to 60 s for `path` to exist (a step of the test process).
bool AwaitFile(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Written whole, then renamed: the test process never reads half a file.
void WriteFileAtomically(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  REQUIRE(std::rename((path + ".tmp").c_str(), path.c_str()) == 0);
}

void AllreduceRanks(ddp::ProcessGroup& pg) {
  const int w = pg.size();
  std::vector<std::int64_t> v(1000, pg.rank() + 1);
  pg.Allreduce(std::span<std::int64_t>(v)).Wait();
  REQUIRE(v.front() == w * (w + 1) / 2);
  REQUIRE(v.back() == w * (w + 1) / 2);
}

}  // namespace

TEST_CASE("the launcher says which store: its TCPStore on one node, without gRPC", "[store-kind]") {
  const char* expect = std::getenv("SDK_EXPECT_TCPSTORE");
  REQUIRE(expect != nullptr);
  const char* tcp = std::getenv("DDPRUN_TCPSTORE_ADDR");
  auto& pg = Group();
  AllreduceRanks(*pg);
  pg->Barrier().Wait();
  if (std::string(expect) == "1") {
    REQUIRE(tcp != nullptr);
    REQUIRE(std::string(tcp).rfind("127.0.0.1:", 0) == 0);
    // The launcher (this worker's parent) has not loaded its gRPC module.
    std::ifstream in("/proc/" + std::to_string(::getppid()) + "/maps");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string maps = ss.str();
    REQUIRE(!maps.empty());
    REQUIRE(maps.find("libddprun_grpc") == std::string::npos);
  } else {
    REQUIRE(tcp == nullptr);  // several nodes: the gRPC Store
  }
}

TEST_CASE("a stranger on the job's TCPStore can neither read nor change the job's keys",
          "[stranger]") {
  // The steps, with the test process (the stranger) in SDK_STRANGER_DIR:
  // group 0 bootstraps; rank 0 names the store in `addr`; the stranger reads
  // what it can and plants decoys at the names the next group's keys have
  // within the job's scope (`planted`); group 1 bootstraps and all-reduces;
  // rank 0 says so (`bootstrapped`); the stranger finds its decoys untouched
  // (`checked`).
  const char* dir_env = std::getenv("SDK_STRANGER_DIR");
  REQUIRE(dir_env != nullptr);
  const std::string dir = dir_env;
  auto& pg = Group();
  AllreduceRanks(*pg);
  if (pg->rank() == 0) WriteFileAtomically(dir + "/addr", std::getenv("DDPRUN_TCPSTORE_ADDR"));
  REQUIRE(AwaitFile(dir + "/planted"));
  auto pg1 = ddp::Init();
  AllreduceRanks(*pg1);
  pg1->Barrier().Wait();
  if (pg1->rank() == 0) WriteFileAtomically(dir + "/bootstrapped", "1");
  REQUIRE(AwaitFile(dir + "/checked"));
}

TEST_CASE("the job's TCPStore gone: a connection error naming DDPRUN_TCPSTORE_ADDR",
          "[tcpstore-gone]") {
  // A port nobody listens on (bound, then closed).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  const std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  ::setenv("DDPRUN_TCPSTORE_ADDR", addr.c_str(), 1);
  try {
    ddp::Init();
    FAIL("Init reached a store that is not there");
  } catch (const ddp::ConnectionError& e) {
    const std::string what = e.what();
    INFO(what);
    REQUIRE(what.find("cannot reach the job's store (DDPRUN_TCPSTORE_ADDR=" + addr) !=
            std::string::npos);
    REQUIRE(what.find("[job ") == 0);
    REQUIRE(what.find('\n') == std::string::npos);
  }
}
