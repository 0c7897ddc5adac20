// The bench worker (ddprun-bench-worker): what each rank of `ddprun bench`
// runs. The launcher (launcher/bench/src/bench_command.cc) starts it through the
// normal agent path, so it gets exactly the backend a trainer would get from
// ddp::Init (NCCL on GPUs, shared memory or Gloo on CPUs).
//
// Protocol with the launcher:
//  - argv: ToWorkerArgs(options) (bench_options.h), parsed by the same parser.
//  - Rank 0 prints the table (or the JSON) on its stdout as rows complete.
//  - Rank 0 writes a one-object JSON summary to $DDPRUN_BENCH_RESULT when set
//    (a file on the launcher's host): {"wrong": N, ...} for the collectives,
//    {"row": {...}, "backend": ...} for one --scaling world size, or
//    {"error": "<one line>"} for a request this group cannot run (an op or
//    type its backend lacks). The launcher turns them into its exit code.
//  - DDPRUN_BENCH_CORRUPT_RANK=<r> (for tests only): rank r alters one
//    element of every result it checks, so #wrong must be non-zero.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/ddp.h"
#include "ddprun/launcher/bench/bench_options.h"

namespace ddprun::bench_worker {

using launcher::bench::BenchOptions;

// "nccl", "gloo (shared memory)", "gloo (tcp)" (DDP_SHM=0), or both for a
// multi-node CPU group: the path ddp::Init takes.
std::string BackendLabel(const ddp::ProcessGroup& pg);

// Device or host memory for the group's collectives (CUDA when the group is NCCL).
class Memory {
 public:
  // device: CUDA memory on the GPU the SDK picks for `local_rank` (local_rank
  // modulo the visible devices, as nccl_backend.cc does), made current here.
  // Host memory comes from `group`'s AllocMemory when given (what a trainer
  // gets for its buffers: shareable memory on one host's shared memory
  // path), else from the heap.
  Memory(bool device, int local_rank, ddp::ProcessGroup* group = nullptr);
  void* Alloc(std::size_t bytes);
  void Free(void* p);
  // Host -> buffer; nothing when they are the same host memory.
  void ToDevice(void* dst, const void* host, std::size_t bytes);
  void ToHost(void* host, const void* src, std::size_t bytes);
  void Copy(void* dst, const void* src, std::size_t bytes);
  void Zero(void* dst, std::size_t bytes);
  // Waits for everything queued on the device (nothing on the host).
  void Sync();
  bool device() const { return device_; }
  // Where the buffers live, for the Reducer's GradSpec.
  ddp::Device where() const {
    return ddp::Device{device_ ? ddp::DeviceType::kCuda : ddp::DeviceType::kCpu, index_};
  }

 private:
  bool device_;
  int index_ = 0;
  ddp::ProcessGroup* group_ = nullptr;  // host memory through the SDK
};

struct CollectiveSummary {
  std::int64_t wrong = 0;
  double avg_busbw_gbs = 0;
};
// The size sweep of every requested op; rank 0 prints. Throws ddp::Error.
CollectiveSummary RunCollectives(ddp::ProcessGroup& pg, const BenchOptions& options);

// One world size of --scaling (the whole job): rank 0's figures. Throws ddp::Error.
launcher::bench::ScalingRow RunScaling(std::shared_ptr<ddp::ProcessGroup> pg,
                                       const BenchOptions& options, std::int64_t* wrong);

}  // namespace ddprun::bench_worker
