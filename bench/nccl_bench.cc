// GPU benchmarks of the worker SDK's NCCL backend, run under ddprun
// (bench/nccl_bench.sh; world size 1 by default, any size works):
//
//   nccl_bench allreduce  SDK Allreduce against raw ncclAllReduce, f32 sum,
//                         in place, 4 KiB .. 256 MiB. The raw side is a second
//                         communicator built the way the SDK builds its own
//                         (ncclCommInitRankConfig, blocking = 0, a non-blocking
//                         stream of the highest priority, same device), so the
//                         difference is the SDK's per-call work: argument
//                         checks, the event that orders the comm stream after
//                         the caller's stream, the completion event, Work.
//                         Two modes, medians over repetitions, SDK and raw
//                         interleaved:
//                           pipelined  K calls back to back, then one wait
//                                      (the last Work / cudaStreamSynchronize);
//                                      per call = elapsed / K (as nccl-tests)
//                           blocking   every call waited (Work::Wait polls
//                                      its event; raw: cudaStreamSynchronize)
//   nccl_bench buckets    The Reducer on a ResNet-50-sized gradient set in
//                         device memory (161 f32 tensors, 25.6 M values,
//                         default buckets): (1) from a bucket becoming ready
//                         (the MarkReady of its last gradient) to its
//                         collective being issued, from the Reducer's own
//                         host timestamps (Reducer::last_step_stats: steady
//                         clock, three reads per bucket); (2) the step
//                         (MarkReady x161 in backward order, Finish, device
//                         sync) against raw ncclAllReduce of the same bucket
//                         sizes from ready-made flat buffers.
//   nccl_bench all        both (the default)
//
// Without a CUDA device (or in a build without CUDA) it prints one line,
// "SKIPPED: no CUDA device", and exits 0. Rank 0 prints one line per figure:
//   nccl allreduce bytes=.. ranks=.. mode=.. sdk_ms=.. raw_ms=.. overhead_pct=.. overhead_us=..
// overhead_us is the SDK's extra time per call. At world size 1 it is the
// figure to read: NCCL's in-place all-reduce then enqueues no device work
// (raw_ms is the host call alone), so overhead_pct divides by almost nothing.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp.h"
#include "resnet50_sizes.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nccl_bench: %s\n", what.c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}
void CheckNccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) Die(std::string(what) + ": " + ncclGetErrorString(r));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Percentile(std::vector<double> v, int pct) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * pct / 100)];
}
double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The raw side: a communicator and stream set up like the SDK's
// (worker_sdk/src/nccl_backend.cc).
struct RawNccl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

  RawNccl(ddp::ProcessGroup& pg, int device) {
    Check(cudaSetDevice(device), "cudaSetDevice");
    int least = 0, greatest = 0;
    Check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    Check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
          "cudaStreamCreateWithPriority");
    // Rank 0's unique id reaches the others through the SDK's own broadcast.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (pg.rank() == 0) CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(id.internal) % 4 == 0);
    void* dev = nullptr;
    Check(cudaMalloc(&dev, sizeof(id.internal)), "cudaMalloc");
    Check(cudaMemcpy(dev, id.internal, sizeof(id.internal), cudaMemcpyHostToDevice), "cudaMemcpy");
    pg.Broadcast(dev, sizeof(id.internal) / 4, ddp::DType::kInt32, 0).Wait();
    Check(cudaMemcpy(id.internal, dev, sizeof(id.internal), cudaMemcpyDeviceToHost), "cudaMemcpy");
    Check(cudaFree(dev), "cudaFree");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    CheckNccl(ncclCommInitRankConfig(&comm, pg.size(), id, pg.rank(), &config),
              "ncclCommInitRankConfig");
    Poll("ncclCommInitRankConfig");
  }
  ~RawNccl() {
    if (comm != nullptr) {
      ncclCommFinalize(comm);
      Poll("ncclCommFinalize");
      ncclCommDestroy(comm);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  void Poll(const char* what) {
    ncclResult_t state = ncclInProgress;
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    do {
      CheckNccl(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
      if (state == ncclInProgress && Clock::now() > deadline) Die(std::string(what) + ": timeout");
    } while (state == ncclInProgress);
    CheckNccl(state, what);
  }
  void Allreduce(void* data, std::size_t count, ncclDataType_t type, ncclRedOp_t op) {
    ncclResult_t r = ncclAllReduce(data, data, count, type, op, comm, stream);
    if (r == ncclInProgress) Poll("ncclAllReduce");
    else CheckNccl(r, "ncclAllReduce");
  }
  void Sync() { Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

// Every rank starts a measurement together, with an idle GPU.
void Align(ddp::ProcessGroup& pg) {
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  pg.Barrier().Wait();
}

void BenchAllreduce(ddp::ProcessGroup& pg, RawNccl& raw, bool print) {
  const std::size_t max_bytes = std::size_t(256) << 20;
  void* buf = nullptr;
  Check(cudaMalloc(&buf, max_bytes), "cudaMalloc");
  Check(cudaMemset(buf, 0, max_bytes), "cudaMemset");  // zeros stay zeros under sum
  for (const char* mode : {"pipelined", "blocking"}) {
    const bool pipelined = std::strcmp(mode, "pipelined") == 0;
    for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
      const std::size_t count = bytes / 4;
      const int calls = bytes <= (1 << 20) ? 100 : bytes <= (16 << 20) ? 20 : 5;
      const int reps = bytes <= (16 << 20) ? 15 : 7;
      auto sdk_run = [&] {
        Align(pg);
        const auto t0 = Clock::now();
        ddp::Work last;
        for (int i = 0; i < calls; ++i) {
          last = pg.Allreduce(buf, count, ddp::DType::kFloat32);
          if (!pipelined) last.Wait();
        }
        last.Wait();
        return Seconds(t0) / calls;
      };
      auto raw_run = [&] {
        Align(pg);
        const auto t0 = Clock::now();
        for (int i = 0; i < calls; ++i) {
          raw.Allreduce(buf, count, ncclFloat32, ncclSum);
          if (!pipelined) raw.Sync();
        }
        raw.Sync();
        return Seconds(t0) / calls;
      };
      sdk_run();  // warm-up (NCCL connects lazily)
      raw_run();
      std::vector<double> sdk, rw;
      for (int r = 0; r < reps; ++r) {  // interleaved, alternating which goes first
        if (r % 2 == 0) {
          sdk.push_back(sdk_run());
          rw.push_back(raw_run());
        } else {
          rw.push_back(raw_run());
          sdk.push_back(sdk_run());
        }
      }
      const double s = Median(sdk), w = Median(rw);
      if (print) {
        std::printf(
            "nccl allreduce bytes=%zu ranks=%d mode=%s sdk_ms=%.4f raw_ms=%.4f overhead_pct=%.1f "
            "overhead_us=%.2f\n",
            bytes, pg.size(), mode, s * 1e3, w * 1e3, (s - w) / w * 100.0, (s - w) * 1e6);
        std::fflush(stdout);
      }
    }
  }
  Check(cudaFree(buf), "cudaFree");
}

using ddprun::bench::ResNet50;

struct ReducerMode {
  const char* name;
  bool view;
  ddp::Compression compression;
};

void BenchBuckets(std::shared_ptr<ddp::ProcessGroup> pg, RawNccl& raw, int device, bool print) {
  const std::vector<std::size_t> sizes = ResNet50();
  std::vector<void*> grads;
  std::size_t total = 0;
  for (std::size_t s : sizes) {
    void* p = nullptr;
    Check(cudaMalloc(&p, s * 4), "cudaMalloc");
    Check(cudaMemset(p, 0, s * 4), "cudaMemset");
    grads.push_back(p);
    total += s;
  }
  const ddp::Device dev{ddp::DeviceType::kCuda, device};
  const int steps = 30, warm = 3;
  for (const ReducerMode& m : {ReducerMode{"copy", false, ddp::Compression::kNone},
                               ReducerMode{"view", true, ddp::Compression::kNone},
                               ReducerMode{"view_f16", true, ddp::Compression::kFloat16}}) {
    ddp::ReducerOptions opts;
    opts.gradient_as_bucket_view = m.view;
    opts.compression = m.compression;
    ddp::Reducer reducer(pg, opts);
    for (std::size_t k = 0; k < sizes.size(); ++k)
      reducer.Register(grads[k], sizes[k], ddp::DType::kFloat32, dev);
    auto step = [&] {
      for (std::size_t k = sizes.size(); k-- > 0;) reducer.MarkReady(k);  // backward order
      reducer.Finish();
      Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // unpacking copies included
    };
    // The raw side: the same buckets, already flat, the same reduction
    // (ncclAvg; with compression: a sum of halves, no conversion kernels).
    for (int i = 0; i < warm; ++i) step();
    std::vector<std::size_t> bucket_count;
    for (const auto& b : reducer.last_step_stats()) bucket_count.push_back(b.count);
    const bool halves = m.compression != ddp::Compression::kNone;
    std::vector<void*> flat;
    for (std::size_t c : bucket_count) {
      void* p = nullptr;
      Check(cudaMalloc(&p, c * 4), "cudaMalloc");
      Check(cudaMemset(p, 0, c * 4), "cudaMemset");
      flat.push_back(p);
    }
    auto raw_step = [&] {
      for (std::size_t b = 0; b < flat.size(); ++b)
        raw.Allreduce(flat[b], bucket_count[b], halves ? ncclFloat16 : ncclFloat32,
                      halves ? ncclSum : ncclAvg);
      raw.Sync();
    };
    raw_step();
    std::vector<double> sdk_t, raw_t, ready_us, issue_us;
    for (int i = 0; i < steps; ++i) {
      Align(*pg);
      auto t0 = Clock::now();
      step();
      sdk_t.push_back(Seconds(t0));
      for (const auto& b : reducer.last_step_stats()) {
        ready_us.push_back(b.ready_to_launch.count() / 1e3);
        issue_us.push_back(b.issue.count() / 1e3);
      }
      Align(*pg);
      t0 = Clock::now();
      raw_step();
      raw_t.push_back(Seconds(t0));
    }
    for (void* p : flat) cudaFree(p);
    if (print) {
      const double s = Median(sdk_t), w = Median(raw_t);
      std::printf(
          "nccl bucket_launch mode=%s ranks=%d buckets=%zu samples=%zu ready_to_launch_us "
          "p50=%.1f p90=%.1f max=%.1f issue_us_p50=%.1f\n",
          m.name, pg->size(), bucket_count.size(), ready_us.size(), Percentile(ready_us, 50),
          Percentile(ready_us, 90), *std::max_element(ready_us.begin(), ready_us.end()),
          Percentile(issue_us, 50));
      std::printf(
          "nccl resnet50 mode=%s ranks=%d tensors=%zu values=%zu sdk_ms=%.3f raw_ms=%.3f "
          "overhead_pct=%.1f\n",
          m.name, pg->size(), sizes.size(), total, s * 1e3, w * 1e3, (s - w) / w * 100.0);
      std::fflush(stdout);
    }
  }
  for (void* p : grads) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode != "all" && mode != "allreduce" && mode != "buckets") {
    std::fprintf(stderr, "usage: nccl_bench [all|allreduce|buckets]\n");
    return 2;
  }
  if (!ddp::CudaAvailable()) {
    const char* rank = std::getenv("RANK");
    if (rank == nullptr || std::strcmp(rank, "0") == 0) std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  try {
    ddp::InitOptions o;
    o.backend = ddp::Backend::kNccl;
    auto pg = ddp::Init(o);
    // The SDK picked LOCAL_RANK's device (or the only one) and made it current.
    int device = 0;
    Check(cudaGetDevice(&device), "cudaGetDevice");
    RawNccl raw(*pg, device);
    const bool print = pg->rank() == 0;
    if (print) {
      cudaDeviceProp prop;
      Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
      int version = 0;
      ncclGetVersion(&version);
      std::printf("nccl device=\"%s\" ranks=%d nccl_version=%d\n", prop.name, pg->size(), version);
    }
    if (mode == "all" || mode == "allreduce") BenchAllreduce(*pg, raw, print);
    if (mode == "all" || mode == "buckets") BenchBuckets(pg, raw, device, print);
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "nccl_bench: %s\n", e.what());
    return 1;
  }
}
