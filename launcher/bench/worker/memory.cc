// Buffers of the bench worker: host memory for CPU groups, CUDA device memory
// for NCCL groups (built with DDPRUN_BENCH_CUDA only), and the backend label.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench_worker.h"

#if DDPRUN_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ddprun::bench_worker {
namespace {

#if DDPRUN_BENCH_CUDA
void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw ddp::Error(ddp::ErrorCode::kInternal,
                     std::string("ddprun bench: ") + what + ": " + cudaGetErrorString(e));
  }
}
#else
[[noreturn]] void NoCuda() {
  throw ddp::UnsupportedError(
      "ddprun bench: the group is on NCCL but this bench worker was built without CUDA; rebuild "
      "with -DDDPRUN_WITH_CUDA=ON, or run on CPUs with DDP_BACKEND=gloo");
}
#endif

}  // namespace

std::string BackendLabel(const ddp::ProcessGroup& pg) {
  if (pg.backend() == ddp::Backend::kNccl) return "nccl";
  // CPU groups (docs/sdk.md): shared memory among the ranks of a host, Gloo
  // TCP between hosts; DDP_SHM=0 makes it TCP only. The SDK says on stderr
  // when it falls back to TCP.
  const char* shm = std::getenv("DDP_SHM");
  if (shm != nullptr && std::string(shm) == "0") return "gloo (tcp)";
  if (pg.info().local_world_size == pg.size()) return "gloo (shared memory)";
  return "gloo (shared memory within a node, tcp between nodes)";
}

Memory::Memory(bool device, int local_rank, ddp::ProcessGroup* group)
    : device_(device), group_(device ? nullptr : group) {
#if DDPRUN_BENCH_CUDA
  int n = 0;
  if (device_ && cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
    index_ = n == 1 ? 0 : local_rank % n;
    Cuda(cudaSetDevice(index_), "cudaSetDevice");
  }
#else
  (void)local_rank;
#endif
}

void* Memory::Alloc(std::size_t bytes) {
  bytes = bytes == 0 ? 1 : bytes;
  if (device_) {
#if DDPRUN_BENCH_CUDA
    void* p = nullptr;
    Cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
#else
    NoCuda();
#endif
  }
  if (group_ != nullptr) return group_->AllocMemory(bytes);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    throw ddp::Error(
        ddp::ErrorCode::kInternal,
        "ddprun bench: out of host memory for the buffers; pass a smaller --sizes MAX");
  }
  return p;
}

void Memory::Free(void* p) {
  if (p == nullptr) return;
#if DDPRUN_BENCH_CUDA
  if (device_) {
    cudaFree(p);
    return;
  }
#endif
  if (group_ != nullptr) return group_->FreeMemory(p);
  std::free(p);
}

void Memory::ToDevice(void* dst, const void* host, std::size_t bytes) {
  if (dst == host) return;
#if DDPRUN_BENCH_CUDA
  if (device_) return Cuda(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
  std::memcpy(dst, host, bytes);
}

void Memory::ToHost(void* host, const void* src, std::size_t bytes) {
#if DDPRUN_BENCH_CUDA
  if (device_) return Cuda(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
  std::memcpy(host, src, bytes);
}

void Memory::Copy(void* dst, const void* src, std::size_t bytes) {
#if DDPRUN_BENCH_CUDA
  if (device_) return Cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace ddprun::bench_worker

namespace ddprun::bench_worker {

void Memory::Zero(void* dst, std::size_t bytes) {
#if DDPRUN_BENCH_CUDA
  if (device_) return Cuda(cudaMemset(dst, 0, bytes), "cudaMemset");
#endif
  std::memset(dst, 0, bytes);
}

void Memory::Sync() {
#if DDPRUN_BENCH_CUDA
  if (device_) Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

}  // namespace ddprun::bench_worker
