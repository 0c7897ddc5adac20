// Device kernels of the NCCL backend (cuda_kernels.cu, built only with
// DDPRUN_WITH_CUDA). This header includes no CUDA header, so plain C++
// translation units can call the launchers: streams are passed as void*
// (a cudaStream_t) and results come back as an int holding a cudaError_t
// (0 = cudaSuccess).
//
// Every launcher only enqueues: the kernel runs on `stream` after what is
// already queued there, and the caller reads the result through the same
// stream (or an event recorded on it). n == 0 launches nothing.
#pragma once

#include <cstddef>

namespace ddp::detail::cuda {

// dst[i] = half(src[i] * scale), rounding to nearest even; to bfloat16 when
// `bf16`, else to IEEE binary16 (|x| >= 65520 becomes inf).
int LaunchCompressF32(const float* src, void* dst, std::size_t n, bool bf16, float scale,
                      void* stream);

// dst[i] = float(src[i]) for binary16 (or bfloat16 when `bf16`) src; exact.
int LaunchDecompressF32(const void* src, float* dst, std::size_t n, bool bf16, void* stream);

}  // namespace ddp::detail::cuda
