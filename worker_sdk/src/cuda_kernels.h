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

#include "copy_span.h"

namespace ddp::detail::cuda {

// dst[i] = half(src[i] * scale), rounding to nearest even; to bfloat16 when
// `bf16`, else to IEEE binary16 (|x| >= 65520 becomes inf).
int LaunchCompressF32(const float* src, void* dst, std::size_t n, bool bf16, float scale,
                      void* stream);

// dst[i] = float(src[i]) for binary16 (or bfloat16 when `bf16`) src; exact.
int LaunchDecompressF32(const void* src, float* dst, std::size_t n, bool bf16, void* stream);

// Every span's copy (both sides device memory, or memory the device can
// address), in one kernel launch per kMaxCopySpans spans instead of
// one cudaMemcpyAsync each (the Reducer packs and unpacks a bucket of up to
// hundreds of gradients). Spans must not overlap one another.
inline constexpr std::size_t kMaxCopySpans = 64;
int LaunchCopyBatch(const CopySpan* spans, std::size_t n, void* stream);

}  // namespace ddp::detail::cuda
