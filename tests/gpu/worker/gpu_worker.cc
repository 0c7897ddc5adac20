// The rank side of the [gpu] tier: a Catch2 program that every rank of a
// ddprun job runs with the same test filter (as tests/sdk/worker/sdk_worker.cc
// does for Gloo). tests/gpu/gpu_test.cc starts it under the real ddprun at
// world size 1, and at 2-4 ranks when that many GPUs are visible. Built only
// with DDPRUN_WITH_CUDA; it needs a CUDA device.
//
// Buffers live in device memory (cudaMalloc); inputs are uploaded and results
// read back with cudaMemcpy on the legacy default stream, which is the
// group's default caller stream, so the SDK orders its collectives after the
// uploads (and Work::Wait has returned before a result is read back).
// References are computed on the host in double.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/half.h"
#include "ddprun/rendezvous/monitoring/metrics_channel.h"
#include "support/process_helpers.h"
#include "support/sdk_values.h"

namespace {

using ddp::DType;
using ddp::ReduceOp;
using ddp::detail::BFloat16ToFloat;
using ddp::detail::Float16ToFloat;
using ddp::detail::FloatToBFloat16;
using ddp::detail::FloatToFloat16;

#define CUDA_REQUIRE(expr)                                             \
  do {                                                                 \
    const cudaError_t e_ = (expr);                                     \
    INFO(#expr << ": " << cudaGetErrorString(e_) << " (" << int(e_) << ")"); \
    REQUIRE(e_ == cudaSuccess);                                        \
  } while (0)

std::shared_ptr<ddp::ProcessGroup>& Group() {
  static std::shared_ptr<ddp::ProcessGroup> pg = [] {
    ddp::InitOptions o;
    o.backend = ddp::Backend::kNccl;
    return ddp::Init(o);
  }();
  return pg;
}

// Device memory, freed at scope exit.
struct DevBuf {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DevBuf(std::size_t b) : bytes(b) { CUDA_REQUIRE(cudaMalloc(&p, b ? b : 1)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p);
  }
  void Upload(const void* host, std::size_t n) {
    if (n) CUDA_REQUIRE(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
  }
  void Download(void* host, std::size_t n) const {
    if (n) CUDA_REQUIRE(cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost));
  }
};

using ddprun::test::IsInt;
using ddprun::test::Value;
using HostBuf = ddprun::test::TypedBuf;

// Unit roundoff of the element type.
double Roundoff(DType d) {
  switch (d) {
    case DType::kFloat32: return std::ldexp(1.0, -24);
    case DType::kFloat64: return std::ldexp(1.0, -53);
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    default: return 0;
  }
}

struct Expected {
  double value = 0;
  double magnitude = 0;  // sum of |input| over ranks, for the float tolerance
};

Expected Reference(ReduceOp op, DType dtype, int world, std::size_t i, std::uint64_t salt) {
  Expected out;
  double acc = Value(0, i, dtype, salt);
  out.magnitude = std::fabs(acc);
  for (int r = 1; r < world; ++r) {
    const double v = Value(r, i, dtype, salt);
    out.magnitude += std::fabs(v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    else if (op == ReduceOp::kMin) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == ReduceOp::kAvg) {
    // NCCL: integers sum then divide (truncating); floats pre-multiply by 1/n.
    acc = IsInt(dtype) ? double(std::int64_t(acc) / world) : acc / world;
  }
  out.value = acc;
  return out;
}

// Integers exactly; floats within (world + 2) roundings of the inputs'
// magnitude (NCCL's summation order and ncclAvg's pre-multiplication differ
// from the reference), plus the rounding of the result itself.
void CheckClose(double got, const Expected& want, DType dtype, int world, std::size_t i) {
  INFO("element " << i << " dtype " << ddp::DTypeName(dtype) << " got " << got << " want "
                  << want.value);
  if (IsInt(dtype)) {
    REQUIRE(got == want.value);
    return;
  }
  const double u = Roundoff(dtype);
  const double tol = (world + 2) * u * (want.magnitude + std::fabs(want.value)) + 1e-300;
  REQUIRE(std::fabs(got - want.value) <= tol);
}

using ddprun::test::kDTypes;
using ddprun::test::kOps;
// Zero, one, uneven, and large enough for several NCCL chunks/channels.
const std::vector<std::size_t> kSizes = {0, 1, 7, 1001, 300007, 4000037};

}  // namespace

// ---- collectives ----

TEST_CASE("nccl allreduce: every dtype and op against a local reference", "[gpu-collectives]") {
  auto& pg = Group();
  REQUIRE(pg->backend() == ddp::Backend::kNccl);
  const int world = pg->size(), rank = pg->rank();
  std::uint64_t salt = 1;
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t n : kSizes) {
        INFO(ddp::DTypeName(dtype) << " " << ddp::ReduceOpName(op) << " n=" << n);
        HostBuf h(dtype, n);
        for (std::size_t i = 0; i < n; ++i) h.Set(i, Value(rank, i, dtype, salt));
        DevBuf d(h.size_bytes());
        d.Upload(h.data(), h.size_bytes());
        pg->Allreduce(n ? d.p : nullptr, n, dtype, op).Wait();
        d.Download(h.data(), h.size_bytes());
        // Every element of the small ones, a stride through the large ones.
        const std::size_t step = n > 100000 ? 97 : 1;
        for (std::size_t i = 0; i < n; i += step) {
          CheckClose(h.Get(i), Reference(op, dtype, world, i, salt), dtype, world, i);
        }
        if (n > 0) CheckClose(h.Get(n - 1), Reference(op, dtype, world, n - 1, salt), dtype,
                              world, n - 1);
        ++salt;
      }
    }
  }
}

TEST_CASE("nccl broadcast from every root", "[gpu-collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (int root = 0; root < world; ++root) {
    for (DType dtype : kDTypes) {
      for (std::size_t n : kSizes) {
        INFO("root " << root << " " << ddp::DTypeName(dtype) << " n=" << n);
        HostBuf h(dtype, n), want(dtype, n);
        for (std::size_t i = 0; i < n; ++i) {
          h.Set(i, Value(rank, i, dtype, 77));
          want.Set(i, Value(root, i, dtype, 77));
        }
        DevBuf d(h.size_bytes());
        d.Upload(h.data(), h.size_bytes());
        pg->Broadcast(n ? d.p : nullptr, n, dtype, root).Wait();
        d.Download(h.data(), h.size_bytes());
        REQUIRE(std::memcmp(h.data(), want.data(), h.size_bytes()) == 0);
      }
    }
  }
}

TEST_CASE("nccl allgather and reduce_scatter", "[gpu-collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (DType dtype : kDTypes) {
    for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(13), std::size_t(40001)}) {
      INFO(ddp::DTypeName(dtype) << " n=" << n);
      HostBuf in(dtype, n), out(dtype, n * world), want(dtype, n * world);
      for (std::size_t i = 0; i < n; ++i) in.Set(i, Value(rank, i, dtype, 5));
      for (int r = 0; r < world; ++r)
        for (std::size_t i = 0; i < n; ++i) want.Set(r * n + i, Value(r, i, dtype, 5));
      DevBuf din(in.size_bytes()), dout(out.size_bytes());
      din.Upload(in.data(), in.size_bytes());
      pg->Allgather(din.p, dout.p, n, dtype).Wait();
      dout.Download(out.data(), out.size_bytes());
      REQUIRE(std::memcmp(out.data(), want.data(), out.size_bytes()) == 0);

      for (ReduceOp op : kOps) {
        INFO(ddp::ReduceOpName(op));
        HostBuf rin(dtype, n * world), rout(dtype, n);
        for (std::size_t i = 0; i < n * world; ++i) rin.Set(i, Value(rank, i, dtype, 9));
        DevBuf drin(rin.size_bytes()), drout(rout.size_bytes());
        drin.Upload(rin.data(), rin.size_bytes());
        pg->ReduceScatter(drin.p, drout.p, n, dtype, op).Wait();
        drout.Download(rout.data(), rout.size_bytes());
        for (std::size_t i = 0; i < n; ++i) {
          CheckClose(rout.Get(i), Reference(op, dtype, world, rank * n + i, 9), dtype, world, i);
        }
      }
    }
  }
}

TEST_CASE("nccl allreduce results are bit-identical on every rank (f32 sum)",
          "[gpu-collectives]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (std::size_t n : {std::size_t(1), std::size_t(16384), std::size_t(3000007)}) {
    INFO("n=" << n);
    std::vector<float> v(n);
    std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(rank + 1);
    for (auto& f : v) {
      x = x * 1664525u + 1013904223u;
      f = static_cast<float>(static_cast<std::int32_t>(x)) * 1.2345e-7f;  // not exactly summable
    }
    DevBuf d(n * 4), all(n * 4 * world);
    d.Upload(v.data(), n * 4);
    pg->Allreduce(d.p, n, DType::kFloat32).Wait();
    pg->Allgather(d.p, all.p, n, DType::kFloat32).Wait();
    std::vector<float> mine(n), every(n * world);
    d.Download(mine.data(), n * 4);
    all.Download(every.data(), n * 4 * world);
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << " vs rank " << rank);
      REQUIRE(std::memcmp(every.data() + r * n, mine.data(), n * 4) == 0);
    }
  }
}

TEST_CASE("nccl: many in flight complete in issue order; barrier", "[gpu-collectives]") {
  auto& pg = Group();
  const int world = pg->size();
  std::vector<std::vector<std::int64_t>> host(16, std::vector<std::int64_t>(1000));
  std::vector<std::unique_ptr<DevBuf>> dev;
  std::vector<ddp::Work> works;
  for (std::size_t k = 0; k < host.size(); ++k) {
    for (std::size_t i = 0; i < host[k].size(); ++i) host[k][i] = std::int64_t(k * 1000 + i);
    dev.push_back(std::make_unique<DevBuf>(host[k].size() * 8));
    dev[k]->Upload(host[k].data(), host[k].size() * 8);
    works.push_back(pg->Allreduce(dev[k]->p, host[k].size(), DType::kInt64));
  }
  // The last one done implies the earlier ones are (one stream, issue order).
  works.back().Wait();
  for (std::size_t k = 0; k < works.size(); ++k) REQUIRE(works[k].IsCompleted());
  for (std::size_t k = 0; k < host.size(); ++k) {
    dev[k]->Download(host[k].data(), host[k].size() * 8);
    for (std::size_t i = 0; i < host[k].size(); i += 97)
      REQUIRE(host[k][i] == std::int64_t(k * 1000 + i) * world);
  }
  pg->Barrier().Wait();
  // Zero elements at a null pointer is fine on NCCL too.
  pg->Allreduce(nullptr, 0, DType::kFloat32).Wait();
}

// ---- streams ----

namespace {
void CUDART_CB SleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(ms)));
}
}  // namespace

TEST_CASE("nccl: collectives wait for the caller's stream; Work::Synchronize orders another",
          "[gpu-stream]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  const std::size_t n = 1 << 20;
  cudaStream_t s1 = nullptr, s2 = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  float* hin = nullptr;
  float* hout = nullptr;
  CUDA_REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&hin), n * 4));
  CUDA_REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&hout), n * 4 * world));
  DevBuf in(n * 4), out(n * 4 * world);
  // Warm-up: NCCL may connect lazily at the first collective, which would
  // otherwise run into the sleep below.
  pg->Allgather(in.p, out.p, n, DType::kFloat32).Wait();
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    for (std::size_t i = 0; i < n; ++i) hin[i] = float(Value(rank, i, DType::kFloat32, round));
    CUDA_REQUIRE(cudaMemset(out.p, 0, out.bytes));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    pg->SetStream(s1);
    // The input lands on s1 only after 300 ms of host sleep on s1: a
    // collective not ordered after s1 would gather the zeros/old values.
    CUDA_REQUIRE(cudaLaunchHostFunc(s1, SleepOnStream, reinterpret_cast<void*>(300)));
    CUDA_REQUIRE(cudaMemcpyAsync(in.p, hin, n * 4, cudaMemcpyHostToDevice, s1));
    const auto t0 = std::chrono::steady_clock::now();
    ddp::Work w = pg->Allgather(in.p, out.p, n, DType::kFloat32);
    REQUIRE_FALSE(w.IsCompleted());  // still behind the sleep on s1
    w.Synchronize(s2);               // no host wait
    const double issued_s = ddprun::test::SecondsSince(t0);
    CHECK(issued_s < 0.25);
    CUDA_REQUIRE(cudaMemcpyAsync(hout, out.p, n * 4 * world, cudaMemcpyDeviceToHost, s2));
    CUDA_REQUIRE(cudaStreamSynchronize(s2));
    REQUIRE(w.IsCompleted());
    for (int r = 0; r < world; ++r)
      for (std::size_t i = 0; i < n; i += 101) {
        INFO("rank " << r << " i " << i);
        REQUIRE(hout[r * n + i] == float(Value(r, i, DType::kFloat32, round)));
      }
    pg->SetStream(nullptr);
  }

  // The Reducer packs and unpacks on the caller's stream too.
  {
    pg->SetStream(s1);
    const std::size_t m = 100003;
    DevBuf g(m * 4);
    ddp::ReducerOptions opts;
    opts.average = false;
    ddp::Reducer reducer(pg, opts);
    reducer.Register(g.p, m, DType::kFloat32, {ddp::DeviceType::kCuda, 0});
    for (std::size_t i = 0; i < m; ++i) hin[i] = float(Value(rank, i, DType::kFloat32, 42));
    CUDA_REQUIRE(cudaLaunchHostFunc(s1, SleepOnStream, reinterpret_cast<void*>(200)));
    CUDA_REQUIRE(cudaMemcpyAsync(g.p, hin, m * 4, cudaMemcpyHostToDevice, s1));
    reducer.MarkReady(0);
    reducer.Finish();
    CUDA_REQUIRE(cudaMemcpyAsync(hout, g.p, m * 4, cudaMemcpyDeviceToHost, s1));
    CUDA_REQUIRE(cudaStreamSynchronize(s1));
    for (std::size_t i = 0; i < m; i += 37) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += Value(r, i, DType::kFloat32, 42);
      INFO("i " << i);
      REQUIRE(double(hout[i]) == Approx(want).margin(1e-3));
    }
    pg->SetStream(nullptr);
  }
  cudaFreeHost(hin);
  cudaFreeHost(hout);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// ---- Reducer ----

namespace {

// A fake model on the device: gradient k has sizes[k] f32 values.
struct DevGrads {
  std::vector<std::size_t> sizes;
  std::vector<std::unique_ptr<DevBuf>> bufs;
  explicit DevGrads(const std::vector<std::size_t>& s) : sizes(s) {
    for (std::size_t n : s) bufs.push_back(std::make_unique<DevBuf>(n * 4));
  }
  std::vector<float> Host(int rank, int step, bool dyadic, std::size_t k) const {
    std::vector<float> h(sizes[k]);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const double v = Value(rank, i + 1000003 * k, DType::kFloat32, step);
      h[i] = dyadic ? float(v) : float(v * 0.7310585786300049);
    }
    return h;
  }
  void Fill(int rank, int step, bool dyadic, const std::vector<float*>& where) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto h = Host(rank, step, dyadic, k);
      if (!h.empty()) CUDA_REQUIRE(cudaMemcpy(where[k], h.data(), h.size() * 4,
                                              cudaMemcpyHostToDevice));
    }
  }
  std::vector<float*> Ptrs() const {
    std::vector<float*> out;
    for (auto& b : bufs) out.push_back(b->get<float>());
    return out;
  }
  std::vector<float> Read(const float* where, std::size_t k) const {
    std::vector<float> h(sizes[k]);
    if (!h.empty()) CUDA_REQUIRE(cudaMemcpy(h.data(), where, h.size() * 4,
                                            cudaMemcpyDeviceToHost));
    return h;
  }
};

const std::vector<std::size_t> kModel = {1000, 7, 250000, 3, 70000, 1, 300001, 64};
constexpr ddp::Device kCuda0 = {ddp::DeviceType::kCuda, 0};

// `steps` steps of `reducer` (f32 sums; its gradients lie at `where`, filled
// through `bucketed`) against a per-tensor all-reduce of the same values in
// `plain`: every gradient bit for bit equal after every step. Gradients are
// marked ready in backward order.
void ExpectBucketedEqualsPlain(ddp::ProcessGroup& pg, ddp::Reducer& reducer, DevGrads& bucketed,
                               const std::vector<float*>& where, DevGrads& plain, int steps,
                               bool dyadic) {
  const std::vector<std::size_t>& model = plain.sizes;
  for (int step = 0; step < steps; ++step) {
    bucketed.Fill(pg.rank(), step, dyadic, where);
    plain.Fill(pg.rank(), step, dyadic, plain.Ptrs());
    for (std::size_t k = model.size(); k-- > 0;) reducer.MarkReady(k);
    reducer.Finish();
    std::vector<ddp::Work> w;
    for (std::size_t k = 0; k < model.size(); ++k)
      w.push_back(pg.Allreduce(plain.bufs[k]->p, model[k], DType::kFloat32));
    for (auto& x : w) x.Wait();
    for (std::size_t k = 0; k < model.size(); ++k) {
      INFO("step " << step << " gradient " << k << " of " << model[k] << " values");
      const auto a = bucketed.Read(where[k], k);
      const auto b = plain.Read(plain.bufs[k]->get<float>(), k);
      REQUIRE(std::memcmp(a.data(), b.data(), model[k] * 4) == 0);
    }
  }
}

}  // namespace

TEST_CASE("nccl reducer: bucketed equals per-tensor allreduce bit for bit (f32 sum)",
          "[gpu-reducer]") {
  auto& pg = Group();
  // Two ranks add in either order with the same result; with more, the
  // order may depend on an element's offset, so use exactly summable values.
  const bool dyadic = pg->size() > 2;
  for (bool view : {false, true}) {
    INFO("gradient_as_bucket_view=" << view);
    DevGrads bucketed(kModel), plain(kModel);
    ddp::ReducerOptions opts;
    opts.average = false;
    opts.bucket_cap_bytes = 512 * 1024;
    opts.first_bucket_bytes = 16 * 1024;
    opts.gradient_as_bucket_view = view;
    ddp::Reducer reducer(pg, opts);
    for (std::size_t k = 0; k < kModel.size(); ++k)
      reducer.Register(bucketed.bufs[k]->p, kModel[k], DType::kFloat32, kCuda0);
    std::vector<float*> where;
    for (std::size_t k = 0; k < kModel.size(); ++k)
      where.push_back(static_cast<float*>(reducer.GradientBuffer(k)));
    ExpectBucketedEqualsPlain(*pg, reducer, bucketed, where, plain, 3, dyadic);
    REQUIRE(reducer.num_buckets() > 2);
    REQUIRE(reducer.num_steps() == 3);
    const auto stats = reducer.last_step_stats();
    REQUIRE(stats.size() == reducer.num_buckets());
    for (const auto& s : stats) REQUIRE(s.ready_to_launch >= s.issue);
  }
}

TEST_CASE("nccl reducer: one bucket of 200 gradients at odd offsets packs and unpacks exactly",
          "[gpu-reducer]") {
  // Copy mode packs a bucket with one copy kernel per 64 gradients
  // (LaunchCopyBatch): 200 members cross three batch boundaries, and odd
  // sizes put most of them at offsets only 4-byte aligned.
  auto& pg = Group();
  std::vector<std::size_t> model;
  for (std::size_t k = 0; k < 200; ++k) model.push_back((k * 37) % 101 + 1 + (k == 7 ? 40000 : 0));
  DevGrads bucketed(model), plain(model);
  ddp::ReducerOptions opts;
  opts.average = false;
  opts.bucket_cap_bytes = 64 << 20;
  opts.first_bucket_bytes = 64 << 20;
  ddp::Reducer reducer(pg, opts);
  for (std::size_t k = 0; k < model.size(); ++k)
    reducer.Register(bucketed.bufs[k]->p, model[k], DType::kFloat32, kCuda0);
  ExpectBucketedEqualsPlain(*pg, reducer, bucketed, bucketed.Ptrs(), plain, 2, pg->size() > 2);
  REQUIRE(reducer.num_buckets() == 1);
}

TEST_CASE("nccl reducer: f16 gradients of odd length pack and unpack exactly (copy mode)",
          "[gpu-reducer]") {
  // Odd element counts leave spans only 2-byte aligned: the copy kernel's
  // 2-byte path. Values are small integers, exact in binary16 when summed.
  auto& pg = Group();
  const int rank = pg->rank();
  const std::vector<std::size_t> model = {3, 1001, 7, 65, 1, 4097};
  std::vector<std::unique_ptr<DevBuf>> grads, plain;
  std::vector<std::vector<std::uint16_t>> host(model.size());
  const std::uint16_t kHalf[] = {0x0000, 0x3C00, 0x4000, 0x4200};  // 0, 1, 2, 3
  for (std::size_t k = 0; k < model.size(); ++k) {
    for (std::size_t i = 0; i < model[k]; ++i) host[k].push_back(kHalf[(i + k + rank) % 4]);
    grads.push_back(std::make_unique<DevBuf>(model[k] * 2));
    plain.push_back(std::make_unique<DevBuf>(model[k] * 2));
  }
  ddp::ReducerOptions opts;
  opts.average = false;
  ddp::Reducer reducer(pg, opts);
  for (std::size_t k = 0; k < model.size(); ++k)
    reducer.Register(grads[k]->p, model[k], DType::kFloat16, kCuda0);
  for (int step = 0; step < 2; ++step) {
    for (std::size_t k = 0; k < model.size(); ++k) {
      grads[k]->Upload(host[k].data(), model[k] * 2);
      plain[k]->Upload(host[k].data(), model[k] * 2);
    }
    for (std::size_t k = model.size(); k-- > 0;) reducer.MarkReady(k);
    reducer.Finish();
    for (std::size_t k = 0; k < model.size(); ++k) {
      pg->Allreduce(plain[k]->p, model[k], DType::kFloat16).Wait();
      std::vector<std::uint16_t> a(model[k]), b(model[k]);
      grads[k]->Download(a.data(), model[k] * 2);
      plain[k]->Download(b.data(), model[k] * 2);
      INFO("step " << step << " gradient " << k << " of " << model[k] << " halves");
      REQUIRE(a == b);
    }
  }
}

TEST_CASE("nccl reducer: averages (ncclAvg); out-of-order MarkReady", "[gpu-reducer]") {
  auto& pg = Group();
  const int world = pg->size();
  for (bool view : {false, true}) {
    INFO("gradient_as_bucket_view=" << view);
    DevGrads grads(kModel);
    ddp::ReducerOptions opts;
    opts.gradient_as_bucket_view = view;
    opts.bucket_cap_bytes = 256 * 1024;
    ddp::Reducer reducer(pg, opts);
    for (std::size_t k = 0; k < kModel.size(); ++k)
      reducer.Register(grads.bufs[k]->p, kModel[k], DType::kFloat32, kCuda0);
    std::vector<float*> where;
    for (std::size_t k = 0; k < kModel.size(); ++k)
      where.push_back(static_cast<float*>(reducer.GradientBuffer(k)));
    if (!view) REQUIRE(where[0] == grads.bufs[0]->p);
    if (view) REQUIRE(where[0] != grads.bufs[0]->p);
    for (int step = 0; step < 2; ++step) {
      grads.Fill(pg->rank(), step, true, where);
      for (std::size_t k = 0; k < kModel.size(); ++k) reducer.MarkReady(k);
      reducer.Finish();
      for (std::size_t k = 0; k < kModel.size(); ++k) {
        const auto got = grads.Read(where[k], k);
        for (std::size_t i = 0; i < kModel[k]; i += 101) {
          double want = 0;
          for (int r = 0; r < world; ++r) want += Value(r, i + 1000003 * k, DType::kFloat32, step);
          REQUIRE(got[i] == Approx(want / world).margin(1e-6));
        }
      }
    }
  }
}

TEST_CASE("nccl reducer: no_sync accumulates locally, the next step syncs the sum",
          "[gpu-reducer]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  const std::size_t n = 5000;
  std::vector<float> h(n, 0.0f);
  DevBuf g(n * 4);
  g.Upload(h.data(), n * 4);
  ddp::Reducer reducer(pg);
  reducer.Register(g.p, n, DType::kFloat32, kCuda0);
  // Three micro-batches: two inside NoSync, one outside; the trainer
  // accumulates into its device buffer (here: host add, then upload).
  for (int micro = 0; micro < 3; ++micro) {
    auto add = [&] {
      g.Download(h.data(), n * 4);
      for (auto& x : h) x += float(rank + micro + 1);
      g.Upload(h.data(), n * 4);
    };
    if (micro < 2) {
      auto guard = reducer.NoSync();
      add();
      reducer.MarkReady(0);
      reducer.Finish();
      g.Download(h.data(), n * 4);
      REQUIRE(h[0] == float((micro + 1) * (rank + 1) + micro * (micro + 1) / 2));
    } else {
      add();
      reducer.MarkReady(0);
      reducer.Finish();
    }
  }
  g.Download(h.data(), n * 4);
  double want = 0;
  for (int r = 0; r < world; ++r) want += 3.0 * (r + 1) + 3.0;
  REQUIRE(h[0] == Approx(want / world));
  REQUIRE(h[n - 1] == Approx(want / world));
  REQUIRE(reducer.num_steps() == 1);
}

TEST_CASE("nccl reducer: f16 and bf16 compression on the device stay within their bounds",
          "[gpu-reducer]") {
  auto& pg = Group();
  const int world = pg->size(), rank = pg->rank();
  for (auto c : {ddp::Compression::kFloat16, ddp::Compression::kBFloat16}) {
    for (bool view : {false, true}) {
      const char* name = c == ddp::Compression::kFloat16 ? "f16" : "bf16";
      INFO(name << " gradient_as_bucket_view=" << view);
      const std::size_t n = 100003;  // not a multiple of 4: the kernels' tail
      std::vector<float> h(n);
      DevBuf g(n * 4);
      ddp::ReducerOptions opts;
      opts.compression = c;
      opts.gradient_as_bucket_view = view;
      ddp::Reducer reducer(pg, opts);
      reducer.Register(g.p, n, DType::kFloat32, kCuda0);
      float* where = static_cast<float*>(reducer.GradientBuffer(0));
      for (std::size_t i = 0; i < n; ++i) h[i] = float(Value(rank, i, DType::kFloat32, 3) / 1000.0);
      CUDA_REQUIRE(cudaMemcpy(where, h.data(), n * 4, cudaMemcpyHostToDevice));
      reducer.MarkReady(0);
      reducer.Finish();
      CUDA_REQUIRE(cudaMemcpy(h.data(), where, n * 4, cudaMemcpyDeviceToHost));
      // As on Gloo (tests/sdk): each of the `world` inputs is rounded once
      // and each of the world-1 partial sums once.
      const double u = c == ddp::Compression::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0, mag = 0;
        for (int r = 0; r < world; ++r) {
          const double v = Value(r, i, DType::kFloat32, 3) / 1000.0 / world;
          exact += v;
          mag += std::fabs(v);
        }
        const double bound = 2.0 * world * u * mag + 6e-8;  // + f16 subnormal spacing
        const double err = std::fabs(double(h[i]) - exact);
        worst = std::max(worst, err / bound);
        INFO("i " << i);
        REQUIRE(err <= bound);
      }
      REQUIRE(reducer.last_step_stats().at(0).wire_bytes == n * 2);
      WARN(name << " compression on the device: worst error " << worst << " of its bound");
    }
  }
}

TEST_CASE("nccl reducer: at world size 1 the kernels round exactly like the host", "[gpu-reducer]") {
  auto& pg = Group();
  if (pg->size() != 1) return;  // a sum of one rank is the rounded input itself
  std::vector<float> in = {0.0f,  -0.0f,  1.0f,    -2.5f,   65504.0f, 65519.0f, 65520.0f,
                           1e9f,  -1e9f,  1e-6f,   3e-8f,   1e-9f,    6.1e-5f,  1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048,     1.0f + 1.0f / 256,   3.14159265f, -1e-40f};
  std::uint32_t x = 12345;
  while (in.size() < 4099) {  // uneven
    x = x * 1664525u + 1013904223u;
    in.push_back(std::ldexp(float(std::int32_t(x)) / 2147483648.0f, int(x % 61) - 40));
  }
  for (auto c : {ddp::Compression::kFloat16, ddp::Compression::kBFloat16}) {
    INFO((c == ddp::Compression::kFloat16 ? "f16" : "bf16"));
    DevBuf g(in.size() * 4);
    g.Upload(in.data(), in.size() * 4);
    ddp::ReducerOptions opts;
    opts.compression = c;
    opts.average = false;  // scale 1
    ddp::Reducer reducer(pg, opts);
    reducer.Register(g.p, in.size(), DType::kFloat32, kCuda0);
    reducer.MarkReady(0);
    reducer.Finish();
    std::vector<float> out(in.size());
    g.Download(out.data(), out.size() * 4);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float want = c == ddp::Compression::kFloat16
                             ? Float16ToFloat(FloatToFloat16(in[i]))
                             : BFloat16ToFloat(FloatToBFloat16(in[i]));
      INFO("i " << i << " in " << in[i] << " got " << out[i] << " want " << want);
      // Bit for bit (inf included); the sign of a zero is not checked.
      if (want != 0.0f) REQUIRE(std::memcmp(&out[i], &want, 4) == 0);
      else REQUIRE(out[i] == 0.0f);
    }
  }
}

TEST_CASE("nccl reducer: broadcast of initial parameters; register after a step",
          "[gpu-reducer]") {
  auto& pg = Group();
  const int rank = pg->rank();
  std::vector<float> w1(1000, float(rank + 1));
  std::vector<double> w2(33, rank * 2.5);
  std::vector<std::int64_t> w3(5, rank - 7);
  DevBuf d1(w1.size() * 4), d2(w2.size() * 8), d3(w3.size() * 8);
  d1.Upload(w1.data(), w1.size() * 4);
  d2.Upload(w2.data(), w2.size() * 8);
  d3.Upload(w3.data(), w3.size() * 8);
  ddp::BroadcastParameters(*pg, {{d1.p, w1.size(), DType::kFloat32, kCuda0},
                                 {d2.p, w2.size(), DType::kFloat64, kCuda0},
                                 {d3.p, w3.size(), DType::kInt64, kCuda0}});
  d1.Download(w1.data(), w1.size() * 4);
  d2.Download(w2.data(), w2.size() * 8);
  d3.Download(w3.data(), w3.size() * 8);
  REQUIRE(w1[999] == 1.0f);
  REQUIRE(w2[32] == 0.0);
  REQUIRE(w3[4] == -7);

  DevBuf a(40), b(40);
  ddp::Reducer reducer(pg);
  reducer.Register(a.p, 10, DType::kFloat32, kCuda0);
  reducer.MarkReady(0);
  reducer.Finish();
  REQUIRE_THROWS_AS(reducer.Register(b.p, 10, DType::kFloat32, kCuda0), ddp::StateError);
  REQUIRE_THROWS_WITH(reducer.Register(b.p, 10, DType::kFloat32, kCuda0),
                      Catch::Contains("before the first step"));
}

TEST_CASE("nccl reducer: mismatched gradients across ranks name the first differing one",
          "[gpu-reducer]") {
  auto& pg = Group();
  if (pg->size() == 1) return;
  DevBuf a(400), b(800), c(20);
  ddp::Reducer reducer(pg);
  reducer.Register(a.p, 100, DType::kFloat32, kCuda0);
  reducer.Register(b.p, pg->rank() == 1 ? 200 : 100, DType::kFloat32, kCuda0);
  reducer.Register(c.p, 5, DType::kFloat32, kCuda0);
  try {
    reducer.MarkReady(2);
    FAIL("no error");
  } catch (const ddp::InvalidArgumentError& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("gradient 1") != std::string::npos);
    REQUIRE(msg.find("rank 1 has 200 x f32") != std::string::npos);
  }
  REQUIRE_THROWS_AS(reducer.Finish(), ddp::StateError);
  pg->Barrier().Wait();
}

// ---- abort ----

TEST_CASE("nccl: an aborted group refuses every later call", "[gpu-abort]") {
  auto& pg = Group();
  ddp::InitOptions o;
  o.backend = ddp::Backend::kNccl;
  auto pg2 = ddp::Init(o);
  REQUIRE(pg2->backend() == ddp::Backend::kNccl);
  DevBuf d(4 * 1024);
  std::vector<float> h(1024, 1.0f);
  d.Upload(h.data(), h.size() * 4);
  pg2->Allreduce(d.p, h.size(), DType::kFloat32).Wait();
  d.Download(h.data(), h.size() * 4);
  REQUIRE(h[0] == float(pg2->size()));
  auto reducer = std::make_unique<ddp::Reducer>(pg2);
  reducer->Register(d.p, h.size(), DType::kFloat32, kCuda0);

  pg2->Abort("gpu test abort");  // ncclCommAbort
  REQUIRE(pg2->aborted());
  REQUIRE_THROWS_AS(pg2->Allreduce(d.p, h.size(), DType::kFloat32), ddp::StateError);
  REQUIRE_THROWS_WITH(pg2->Barrier(), Catch::Contains("gpu test abort"));
  REQUIRE_THROWS_AS(pg2->Broadcast(d.p, h.size(), DType::kFloat32, 0), ddp::StateError);
  REQUIRE_THROWS_AS(pg2->Allgather(d.p, d.p, 1, DType::kFloat32), ddp::StateError);
  REQUIRE_THROWS_AS(reducer->MarkReady(0), ddp::StateError);
  reducer.reset();
  pg2.reset();  // destroying an aborted group does not hang
  pg->Barrier().Wait();  // the first group is untouched
}

TEST_CASE("nccl: survivors of a peer killed with SIGKILL get PeerLostError at once",
          "[gpu-peer-lost]") {
  // Under --restart_policy=inplace: every rank all-reduces device memory in a
  // loop, the last rank SIGKILLs itself after 50 iterations; the agent breaks
  // the group in the control block and every survivor's wait fails with
  // PeerLostError (communicator aborted) well before DDP_TIMEOUT_SEC.
  ::signal(SIGTERM, SIG_IGN);
  auto& pg = Group();
  REQUIRE(pg->size() >= 2);
  DevBuf d(4 * 1024);
  std::vector<float> h(1024, 1.0f);
  d.Upload(h.data(), h.size() * 4);
  const int victim = pg->size() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::string report = "no error";
  try {
    for (int i = 0; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60); ++i) {
      if (pg->rank() == victim && i == 50) ::kill(::getpid(), SIGKILL);
      pg->Allreduce(d.p, h.size(), DType::kFloat32).Wait();
    }
  } catch (const ddp::PeerLostError& e) {
    report = std::string("peer lost after ") +
             std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) +
             " s: " + e.what();
    REQUIRE(pg->aborted());
    REQUIRE_THROWS_AS(pg->Barrier(), ddp::StateError);
  }
  if (const char* path = std::getenv("GPU_RESULT_FILE")) {
    std::ofstream(std::string(path) + "." + std::to_string(pg->rank())) << report << "\n";
  }
  std::_Exit(3);
}

// ---- monitoring ----

namespace {
// This worker's metrics channel as the agent reads it (ddprun sets
// DDPRUN_METRICS_FILE for every worker).
ddprun::rendezvous::ChannelSnapshot ReadOwnChannel() {
  const char* path = std::getenv("DDPRUN_METRICS_FILE");
  INFO("DDPRUN_METRICS_FILE is not set: not under ddprun with monitoring on?");
  REQUIRE(path != nullptr);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  ddprun::rendezvous::ChannelReader reader(fd);
  auto snap = reader.Read();
  ::close(fd);
  INFO(snap.status().message());
  REQUIRE(snap.ok());
  return *snap;
}

const ddprun::rendezvous::ChannelSnapshot::Op* FindOp(
    const ddprun::rendezvous::ChannelSnapshot& s, const std::string& op) {
  for (const auto& o : s.ops)
    if (o.op == op) return &o;
  return nullptr;
}
}  // namespace

TEST_CASE("nccl: collectives are recorded in the metrics channel (op, bytes, seq, duration)",
          "[gpu-metrics]") {
  auto& pg = Group();
  const auto before = ReadOwnChannel();
  const auto* ar0 = FindOp(before, "allreduce");
  const std::int64_t count0 = ar0 ? ar0->count : 0, bytes0 = ar0 ? ar0->bytes_total : 0;
  const double seconds0 = ar0 ? ar0->seconds_total : 0;
  constexpr int kCalls = 8;
  constexpr std::size_t kCount = 1 << 20;  // 4 MiB of f32: a duration well above zero
  DevBuf buf(kCount * 4);
  CUDA_REQUIRE(cudaMemset(buf.p, 0, kCount * 4));
  std::vector<ddp::Work> works;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kCalls; ++k) works.push_back(pg->Allreduce(buf.p, kCount, DType::kFloat32));
  works.back().Wait();  // the ends are recorded once seen done, without a sync of their own
  const double wall0 = ddprun::test::SecondsSince(t0);
  const auto after = ReadOwnChannel();
  REQUIRE((after.flags & ddprun::rendezvous::kChannelFlagCollectives) != 0);
  CHECK(after.collective_seq >= before.collective_seq + kCalls);
  CHECK_FALSE(after.in_collective);
  const auto* ar = FindOp(after, "allreduce");
  REQUIRE(ar != nullptr);
  CHECK(ar->count - count0 == kCalls);
  CHECK(ar->bytes_total - bytes0 == std::int64_t(kCalls * kCount * 4));
  CHECK(ar->seconds_total > 0);
  CHECK(ar->seconds_total - seconds0 <= wall0);
  CHECK(after.comm_seconds_total > before.comm_seconds_total);
  if (pg->size() > 1) CHECK(ar->busbw_gbps > 0);

  // A duration is the collective's own device time, from its start: not the
  // caller's work queued before it (here a 1 GiB memset on the caller's
  // stream before each call), not the time since the collective before.
  const double seconds1 = ar->seconds_total;
  DevBuf big(std::size_t{1} << 30);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  works.clear();
  const auto t1 = std::chrono::steady_clock::now();
  for (int k = 0; k < kCalls; ++k) {
    CUDA_REQUIRE(cudaMemsetAsync(big.p, k, big.bytes, nullptr));
    works.push_back(pg->Allreduce(buf.p, kCount, DType::kFloat32));
  }
  works.back().Wait();
  const double wall1 = ddprun::test::SecondsSince(t1);
  const auto last = ReadOwnChannel();
  const auto* ar1 = FindOp(last, "allreduce");
  REQUIRE(ar1 != nullptr);
  CHECK(ar1->count - ar->count == kCalls);
  const double seconds = ar1->seconds_total - seconds1;
  INFO("collectives " << seconds << " s of " << wall1 << " s wall");
  CHECK(seconds > 0);
  CHECK(seconds <= wall1);
  // At world size 1 the collectives do no device work and the memsets fill the wall time.
  if (pg->size() == 1) CHECK(seconds < 0.25 * wall1);
}
