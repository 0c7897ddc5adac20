// Worker SDK benchmarks, run under ddprun (bench/allreduce_bench.sh runs them
// next to torch's Gloo in the same run):
//   allreduce_bench allreduce [max_bytes]
//                               bus bandwidth (nccl-tests: busbw = S/t * 2(n-1)/n),
//                               f32 sum, 4 KiB .. 256 MiB, median per call
//   allreduce_bench resnet50 [bucket_cap_mb]
//                               the ResNet-50 gradient set (161 f32 tensors,
//                               25.6 M values): per tensor, blocking; per tensor,
//                               all issued then waited; bucketed (Reducer, defaults)
//   allreduce_bench latency     small-message latency: 4 KiB .. 1 MiB, 300 calls
//                               back to back (no barrier), p10/p50/p90 per call
// Buffers are allocated and touched once, then reused (first-touch page faults
// are slow on these VMs). Rank 0 prints one line per measurement.
// Buffers: the allreduce and latency buffers come from ProcessGroup::AllocMemory
// (what `ddprun bench` uses: on one host, shareable memory that the all-reduce
// folds in place); BUFFERS=heap puts them on the heap instead (the staged path:
// copied into the group's segment and back). The ResNet-50 gradients are the
// trainer's (heap) in every mode; the Reducer's buckets come from the SDK.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "resnet50_sizes.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, int pct) {
  std::sort(v.begin(), v.end());
  return v[v.size() * pct / 100];
}

template <class Fn>
double MedianSeconds(ddp::ProcessGroup& pg, int iters, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    pg.Barrier().Wait();
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(t);
}

using ddprun::bench::ResNet50;

// `count` floats from the SDK (default) or the heap (BUFFERS=heap), touched.
class Floats {
 public:
  Floats(ddp::ProcessGroup& pg, std::size_t count) : pg_(pg) {
    const char* b = std::getenv("BUFFERS");
    heap_ = b != nullptr && std::string(b) == "heap";
    if (heap_) {
      vec_.assign(count, 1.0f);
      p_ = vec_.data();
    } else {
      p_ = static_cast<float*>(pg.AllocMemory(count * sizeof(float)));
      std::fill(p_, p_ + count, 1.0f);
    }
  }
  ~Floats() {
    if (!heap_) pg_.FreeMemory(p_);
  }
  float* data() { return p_; }
  const char* kind() const { return heap_ ? "heap" : "sdk"; }

 private:
  ddp::ProcessGroup& pg_;
  bool heap_ = false;
  std::vector<float> vec_;
  float* p_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "allreduce";
  try {
    auto pg = ddp::Init();
    const int n = pg->size();
    const bool print = pg->rank() == 0;
    if (mode == "allreduce") {
      // Optional second argument: the largest size (bytes, default 256 MiB).
      const std::size_t max_bytes =
          argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::size_t(256) << 20;
      Floats buf(*pg, max_bytes / 4);  // touched once
      for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        const std::size_t count = bytes / 4;
        const int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 30 : 7;
        pg->Allreduce(buf.data(), count, ddp::DType::kFloat32).Wait();  // warm-up
        const double t = MedianSeconds(*pg, iters, [&] {
          pg->Allreduce(buf.data(), count, ddp::DType::kFloat32).Wait();
        });
        const double busbw = bytes / t * 2.0 * (n - 1) / n / 1e9;
        if (print)
          std::printf(
              "sdk allreduce bytes=%zu ranks=%d median_ms=%.4f busbw_GBps=%.3f buffers=%s\n", bytes,
              n, t * 1e3, busbw, buf.kind());
      }
    } else if (mode == "latency") {
      Floats buf(*pg, (std::size_t(1) << 20) / 4);  // touched once
      for (std::size_t bytes = 4096; bytes <= (std::size_t(1) << 20); bytes *= 4) {
        const std::size_t count = bytes / 4;
        pg->Allreduce(buf.data(), count, ddp::DType::kFloat32).Wait();  // warm-up
        pg->Barrier().Wait();
        std::vector<double> t;
        for (int i = 0; i < 300; ++i) {
          const auto t0 = Clock::now();
          pg->Allreduce(buf.data(), count, ddp::DType::kFloat32).Wait();
          t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
        }
        if (print)
          std::printf("sdk latency bytes=%zu ranks=%d p10_ms=%.4f p50_ms=%.4f p90_ms=%.4f\n",
                      bytes, n, Percentile(t, 10), Percentile(t, 50), Percentile(t, 90));
      }
    } else if (mode == "resnet50") {
      const std::vector<std::size_t> sizes = ResNet50();
      std::size_t total = 0;
      for (auto s : sizes) total += s;
      std::vector<std::vector<float>> grads;
      for (auto s : sizes) grads.emplace_back(s, 0.5f);
      if (print) std::printf("sdk resnet50 tensors=%zu values=%zu\n", sizes.size(), total);
      const int iters = 9;
      const double blocking = MedianSeconds(*pg, iters, [&] {
        for (auto& g : grads) pg->Allreduce(std::span<float>(g)).Wait();
      });
      const double issued = MedianSeconds(*pg, iters, [&] {
        std::vector<ddp::Work> w;
        for (auto& g : grads) w.push_back(pg->Allreduce(std::span<float>(g)));
        for (auto& x : w) x.Wait();
      });
      // Optional second argument: the buckets' cap in MiB (default: the
      // Reducer's, 25 MiB like torch DDP's bucket_cap_mb).
      ddp::ReducerOptions opts;
      if (argc > 2) opts.bucket_cap_bytes = std::strtoull(argv[2], nullptr, 10) << 20;
      ddp::Reducer reducer(pg, opts);
      for (auto& g : grads) reducer.Register(std::span<float>(g));
      auto step = [&] {
        for (std::size_t k = grads.size(); k-- > 0;) reducer.MarkReady(k);
        reducer.Finish();
      };
      step();  // builds (and touches) the buckets, checks ranks agree
      const double bucketed = MedianSeconds(*pg, iters, step);
      ddp::ReducerOptions view_opts = opts;
      view_opts.gradient_as_bucket_view = true;
      ddp::Reducer view(pg, view_opts);
      for (auto& g : grads) view.Register(std::span<float>(g));
      auto vstep = [&] {
        for (std::size_t k = grads.size(); k-- > 0;) view.MarkReady(k);
        view.Finish();
      };
      vstep();
      const double viewed = MedianSeconds(*pg, iters, vstep);
      if (print) {
        std::printf("sdk resnet50 per_tensor_blocking_ms=%.1f\n", blocking * 1e3);
        std::printf("sdk resnet50 per_tensor_issued_ms=%.1f\n", issued * 1e3);
        std::printf("sdk resnet50 bucketed_ms=%.1f buckets=%zu\n", bucketed * 1e3,
                    reducer.num_buckets());
        std::printf("sdk resnet50 bucketed_view_ms=%.1f\n", viewed * 1e3);
      }
    } else {
      std::fprintf(stderr, "usage: allreduce_bench allreduce|latency|resnet50\n");
      return 2;
    }
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
