// One world size of `ddprun bench --scaling`: a synthetic data-parallel step.
//
// The model is ResNet-50's gradient set (launcher/bench/worker/resnet50_sizes.h: 161 float32
// tensors, 25.6 M values) registered with the SDK's Reducer (its defaults:
// 25 MiB buckets, 1 MiB first bucket, copy mode). A step is
//   forward:  compute_ms / 3 of waiting;
//   backward: 2 * compute_ms / 3, during which the gradients become ready in
//             reverse registration order, each after its share of the time
//             (proportional to its size), and are marked ready, so the
//             Reducer launches each bucket as soon as it is complete;
//   Finish(): waits for the buckets and averages.
// The compute is a wait (sleep_until an absolute deadline), as on an
// accelerator: the host's cores stay free for the communication. The
// communication is real. Exposed communication = the time Finish() blocks.
// On NCCL the gradients are device memory (the SDK's GPU path); on CPUs host memory.
//
// At one rank the step has no Reducer at all (compute alone, exposed 0): the
// baseline is training without data parallelism, as a scaling efficiency is
// measured against (torch's DDP figures compare with one GPU without DDP). A
// one-rank Reducer still packs, unpacks and averages 100 MB per step, and did
// all of it inside Finish(), where 2 ranks overlap part of it with the
// backward: the old baseline exposed more than 2 ranks did, and 2 ranks
// showed 112-118 % efficiency.
//
// Check: every rank fills its gradients with rank + 1 before the first step;
// after it, every value must be the average (world + 1) / 2 (counted in `wrong`).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>

#include "bench_worker.h"
#include "resnet50_sizes.h"

namespace ddprun::bench_worker {
namespace lb = launcher::bench;
namespace {

using Clock = std::chrono::steady_clock;

struct StepTimes {
  double step_s = 0, compute_s = 0, exposed_s = 0;
};

}  // namespace

lb::ScalingRow RunScaling(std::shared_ptr<ddp::ProcessGroup> pg, const BenchOptions& o,
                          std::int64_t* wrong) {
  const std::vector<std::size_t> sizes = ddprun::bench::ResNet50();
  std::vector<std::size_t> offset(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offset.begin() + 1);
  const std::size_t total = offset.back();
  // The gradients: device memory on NCCL, host memory on CPUs.
  Memory mem(pg->backend() == ddp::Backend::kNccl, pg->info().local_rank);
  std::vector<float> host(total, static_cast<float>(pg->rank() + 1));
  float* grads = static_cast<float*>(mem.Alloc(total * sizeof(float)));
  struct Release {
    Memory& m;
    void* p;
    ~Release() { m.Free(p); }
  } release{mem, grads};
  mem.ToDevice(grads, host.data(), total * sizeof(float));

  ddp::Reducer reducer(pg);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    reducer.Register(grads + offset[i], sizes[i], ddp::DType::kFloat32, mem.where());
  }

  const auto compute = std::chrono::duration<double, std::milli>(o.compute_ms);
  const auto forward = std::chrono::duration_cast<Clock::duration>(compute / 3);
  const auto backward = std::chrono::duration_cast<Clock::duration>(compute - compute / 3);
  const bool reduce = pg->size() > 1;  // the one-rank baseline trains without DDP
  auto step = [&]() {
    StepTimes t;
    const auto t0 = Clock::now();
    std::this_thread::sleep_until(t0 + forward);
    const auto b0 = Clock::now();
    std::size_t done = 0;  // values whose gradient is ready, counted from the last tensor
    for (std::size_t i = sizes.size(); i-- > 0;) {
      done += sizes[i];
      const double share = static_cast<double>(done) / static_cast<double>(total);
      std::this_thread::sleep_until(b0 +
                                    std::chrono::duration_cast<Clock::duration>(backward * share));
      if (reduce) reducer.MarkReady(i);
    }
    const auto t1 = Clock::now();
    if (reduce) {
      reducer.Finish();
      mem.Sync();  // on a GPU, Finish may return before the last kernels ran
    }
    const auto t2 = Clock::now();
    t.step_s = std::chrono::duration<double>(t2 - t0).count();
    t.compute_s = std::chrono::duration<double>(t1 - t0).count();
    t.exposed_s = std::chrono::duration<double>(t2 - t1).count();
    return t;
  };

  // The first step is checked, then the warm-up, then the timed steps.
  step();
  const float want = static_cast<float>(pg->size() + 1) / 2.0f;
  mem.ToHost(host.data(), grads, total * sizeof(float));
  std::int64_t bad = 0;
  for (float v : host) bad += std::abs(v - want) > 1e-6f * want ? 1 : 0;
  // Summed over the ranks through the group's memory (device memory on NCCL).
  void* scratch = mem.Alloc(sizeof(bad));
  mem.ToDevice(scratch, &bad, sizeof(bad));
  pg->Allreduce(scratch, 1, ddp::DType::kInt64).Wait();
  mem.ToHost(&bad, scratch, sizeof(bad));
  mem.Free(scratch);
  *wrong = bad;

  for (int i = 0; i < o.warmup; ++i) step();
  pg->Barrier().Wait();
  StepTimes sum;
  for (int i = 0; i < o.iters; ++i) {
    const StepTimes t = step();
    sum.step_s += t.step_s;
    sum.compute_s += t.compute_s;
    sum.exposed_s += t.exposed_s;
  }
  lb::ScalingRow row;
  row.ranks = pg->size();
  row.global_batch = o.batch * pg->size();
  row.step_ms = sum.step_s / o.iters * 1e3;
  row.compute_ms = sum.compute_s / o.iters * 1e3;
  row.exposed_ms = sum.exposed_s / o.iters * 1e3;
  row.samples_per_s = row.step_ms > 0 ? row.global_batch / (row.step_ms / 1e3) : 0;
  return row;
}

}  // namespace ddprun::bench_worker
