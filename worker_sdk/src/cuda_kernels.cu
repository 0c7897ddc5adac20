// Device kernels of the NCCL backend: float32 gradient buckets to and from
// their float16/bfloat16 wire format (the Reducer's compression on GPU).
// Rounding matches the host path (half.h): round to nearest even, overflow
// to inf for binary16. Grid-stride loops; 4 elements per thread per step
// when the pointers allow 16-byte (float4) and 8-byte (ushort4) accesses,
// which cudaMalloc'd bucket buffers always do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_kernels.h"

namespace ddp::detail::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond this

template <bool kBf16>
__device__ __forceinline__ unsigned short ToWire(float x) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __half_as_ushort(__float2half_rn(x));
  }
}

template <bool kBf16>
__device__ __forceinline__ float FromWire(unsigned short h) {
  if constexpr (kBf16) {
    return __bfloat162float(__ushort_as_bfloat16(h));
  } else {
    return __half2float(__ushort_as_half(h));
  }
}

template <bool kBf16>
__global__ void CompressKernel(const float* __restrict__ src, unsigned short* __restrict__ dst,
                               std::size_t n, float scale, bool vec4) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  const std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vec4) {
    const std::size_t n4 = n / 4;
    const float4* s4 = reinterpret_cast<const float4*>(src);
    ushort4* d4 = reinterpret_cast<ushort4*>(dst);
    for (std::size_t k = first; k < n4; k += stride) {
      const float4 v = s4[k];
      d4[k] = make_ushort4(ToWire<kBf16>(v.x * scale), ToWire<kBf16>(v.y * scale),
                           ToWire<kBf16>(v.z * scale), ToWire<kBf16>(v.w * scale));
    }
    done = n4 * 4;
  }
  for (std::size_t k = done + first; k < n; k += stride) dst[k] = ToWire<kBf16>(src[k] * scale);
}

template <bool kBf16>
__global__ void DecompressKernel(const unsigned short* __restrict__ src, float* __restrict__ dst,
                                 std::size_t n, bool vec4) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  const std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vec4) {
    const std::size_t n4 = n / 4;
    const ushort4* s4 = reinterpret_cast<const ushort4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (std::size_t k = first; k < n4; k += stride) {
      const ushort4 v = s4[k];
      d4[k] = make_float4(FromWire<kBf16>(v.x), FromWire<kBf16>(v.y), FromWire<kBf16>(v.z),
                          FromWire<kBf16>(v.w));
    }
    done = n4 * 4;
  }
  for (std::size_t k = done + first; k < n; k += stride) dst[k] = FromWire<kBf16>(src[k]);
}

// A batch of copies as a kernel parameter (64 x 24 bytes, within the 4 KiB
// every architecture takes). Block row y copies span y; the row's blocks
// stride through it with the widest access its alignment allows.
struct SpanBatch {
  CopySpan span[kMaxCopySpans];
};

template <class T>
__device__ __forceinline__ void CopyWords(void* dst, const void* src, std::size_t n,
                                          std::size_t first, std::size_t stride) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (std::size_t k = first; k < n; k += stride) d[k] = s[k];
}

__global__ void CopyBatchKernel(SpanBatch batch) {
  const CopySpan c = batch.span[blockIdx.y];
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  const std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uintptr_t bits =
      reinterpret_cast<std::uintptr_t>(c.dst) | reinterpret_cast<std::uintptr_t>(c.src) | c.bytes;
  if (bits % 16 == 0) {
    CopyWords<uint4>(c.dst, c.src, c.bytes / 16, first, stride);
  } else if (bits % 4 == 0) {
    CopyWords<std::uint32_t>(c.dst, c.src, c.bytes / 4, first, stride);
  } else if (bits % 2 == 0) {  // f16/bf16 gradients of odd length
    CopyWords<std::uint16_t>(c.dst, c.src, c.bytes / 2, first, stride);
  } else {
    CopyWords<unsigned char>(c.dst, c.src, c.bytes, first, stride);
  }
}

bool Aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

unsigned Blocks(std::size_t work) {
  return static_cast<unsigned>(
      std::min(kMaxBlocks, std::max<std::size_t>(1, (work + kThreads - 1) / kThreads)));
}

}  // namespace

int LaunchCompressF32(const float* src, void* dst, std::size_t n, bool bf16, float scale,
                      void* stream) {
  if (n == 0) return static_cast<int>(cudaSuccess);
  auto* out = static_cast<unsigned short*>(dst);
  const bool vec4 = Aligned(src, 16) && Aligned(dst, 8);
  const unsigned blocks = Blocks(vec4 ? (n + 3) / 4 : n);
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16) {
    CompressKernel<true><<<blocks, kThreads, 0, s>>>(src, out, n, scale, vec4);
  } else {
    CompressKernel<false><<<blocks, kThreads, 0, s>>>(src, out, n, scale, vec4);
  }
  return static_cast<int>(cudaGetLastError());
}

int LaunchCopyBatch(const CopySpan* spans, std::size_t n, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  for (std::size_t at = 0; at < n; at += kMaxCopySpans) {
    SpanBatch batch{};
    const std::size_t k = std::min(kMaxCopySpans, n - at);
    std::size_t widest = 0;
    for (std::size_t i = 0; i < k; ++i) {
      batch.span[i] = spans[at + i];
      widest = std::max(widest, spans[at + i].bytes);
    }
    if (widest == 0) continue;
    // Enough blocks per row for the largest span at 16 bytes a thread, at
    // most 512 (two waves of an H100's 132 SMs at 4 blocks each): rows of
    // small spans end at once.
    const unsigned x = std::min(512u, Blocks((widest + 15) / 16));
    CopyBatchKernel<<<dim3(x, static_cast<unsigned>(k)), kThreads, 0, s>>>(batch);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  return static_cast<int>(cudaSuccess);
}

int LaunchDecompressF32(const void* src, float* dst, std::size_t n, bool bf16, void* stream) {
  if (n == 0) return static_cast<int>(cudaSuccess);
  const auto* in = static_cast<const unsigned short*>(src);
  const bool vec4 = Aligned(src, 8) && Aligned(dst, 16);
  const unsigned blocks = Blocks(vec4 ? (n + 3) / 4 : n);
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16) {
    DecompressKernel<true><<<blocks, kThreads, 0, s>>>(in, dst, n, vec4);
  } else {
    DecompressKernel<false><<<blocks, kThreads, 0, s>>>(in, dst, n, vec4);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ddp::detail::cuda
