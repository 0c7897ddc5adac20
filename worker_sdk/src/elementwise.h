// Host elementwise kernels shared by the Gloo backend and the Reducer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/types.h"
#include "half.h"

namespace ddp::detail {

// data /= divisor, in the element type (integers truncate).
inline void DivideInPlace(void* data, std::size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(data);
      const float d = float(divisor);
      for (std::size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DType::kFloat64: {
      auto* p = static_cast<double*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case DType::kInt32: {
      auto* p = static_cast<std::int32_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case DType::kInt64: {
      auto* p = static_cast<std::int64_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case DType::kFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = FloatToFloat16(Float16ToFloat(p[i]) / divisor);
      break;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = FloatToBFloat16(BFloat16ToFloat(p[i]) / divisor);
      break;
    }
  }
}

// dst[i] = half(src[i] * scale): float32 gradients to their wire format.
inline void CompressFloat32(const float* src, std::uint16_t* dst, std::size_t n, DType wire,
                            float scale) {
  if (wire == DType::kFloat16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = FloatToFloat16(src[i] * scale);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i] * scale);
  }
}

inline void DecompressFloat32(const std::uint16_t* src, float* dst, std::size_t n, DType wire) {
  if (wire == DType::kFloat16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
  }
}

}  // namespace ddp::detail
