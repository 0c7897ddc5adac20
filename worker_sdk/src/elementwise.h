// Host elementwise kernels shared by the Gloo backend, the shared-memory
// path and the Reducer. Defined in elementwise.cc, which is compiled with
// -O3 so that these loops are vectorised (at -O2 GCC 12 leaves loops that
// need a runtime alias check scalar, and out == a is allowed here); the
// f32/f64/i32/i64 reductions also for AVX2 and AVX-512, picked at run time
// (__builtin_cpu_supports), never assumed from the build machine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/types.h"

namespace ddp::detail {

// out[i] = op(a[i], b[i]) for i < n, in the element type of the DType it was
// made for (f16/bf16 are widened to float and rounded back). out may equal a
// or b. Every rank that evaluates it on the same inputs gets the same bits.
using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t n);

// The function for (dtype, op); kAvg reduces as kSum (divide afterwards).
ReduceFn ReduceFunc(DType dtype, ReduceOp op);

// out[i] = copy[i] = op(a[i], b[i]) in one pass: the shared-memory all-
// reduce's last fold, written to the shared result and to the rank's own
// output at once (one read of the result less). out and copy may each equal
// a or b (every element is read before it is written), not each other.
using ReduceFn2 = void (*)(void* out, void* copy, const void* a, const void* b, std::size_t n);

// The fused function for (dtype, op), or nullptr where there is none (f16,
// bf16: fold with ReduceFunc, then copy). kAvg reduces as kSum.
ReduceFn2 ReduceFunc2(DType dtype, ReduceOp op);

// data /= divisor, in the element type (integers truncate).
void DivideInPlace(void* data, std::size_t n, DType dtype, int divisor);

// dst[i] = half(src[i] * scale): float32 gradients to their wire format.
void CompressFloat32(const float* src, std::uint16_t* dst, std::size_t n, DType wire, float scale);

void DecompressFloat32(const std::uint16_t* src, float* dst, std::size_t n, DType wire);

}  // namespace ddp::detail
