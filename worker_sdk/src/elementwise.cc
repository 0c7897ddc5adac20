#include "elementwise.h"

#include "half.h"

namespace ddp::detail {
namespace {

struct Plus {
  template <class T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct Min {
  template <class T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

template <class T, class Op>
void ReduceTyped(void* c, const void* a, const void* b, std::size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  Op op;
  for (std::size_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
}

template <float (*ToF)(std::uint16_t), std::uint16_t (*FromF)(float), class Op>
void ReduceHalf(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  Op op;
  for (std::size_t i = 0; i < n; ++i) out[i] = FromF(op(ToF(x[i]), ToF(y[i])));
}

template <class Op>
ReduceFn FuncFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &ReduceTyped<float, Op>;
    case DType::kFloat64:
      return &ReduceTyped<double, Op>;
    case DType::kInt32:
      return &ReduceTyped<std::int32_t, Op>;
    case DType::kInt64:
      return &ReduceTyped<std::int64_t, Op>;
    case DType::kFloat16:
      return &ReduceHalf<Float16ToFloat, FloatToFloat16, Op>;
    case DType::kBFloat16:
      return &ReduceHalf<BFloat16ToFloat, FloatToBFloat16, Op>;
  }
  return nullptr;
}

template <class T>
void DivideTyped(T* p, std::size_t n, T d) {
  for (std::size_t i = 0; i < n; ++i) p[i] /= d;
}

}  // namespace

ReduceFn ReduceFunc(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return FuncFor<Plus>(dtype);
    case ReduceOp::kMax:
      return FuncFor<Max>(dtype);
    case ReduceOp::kMin:
      return FuncFor<Min>(dtype);
  }
  return nullptr;
}

void DivideInPlace(void* data, std::size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return DivideTyped(static_cast<float*>(data), n, static_cast<float>(divisor));
    case DType::kFloat64:
      return DivideTyped(static_cast<double*>(data), n, static_cast<double>(divisor));
    case DType::kInt32:
      return DivideTyped(static_cast<std::int32_t*>(data), n, std::int32_t(divisor));
    case DType::kInt64:
      return DivideTyped(static_cast<std::int64_t*>(data), n, std::int64_t(divisor));
    case DType::kFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = FloatToFloat16(Float16ToFloat(p[i]) / divisor);
      return;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = FloatToBFloat16(BFloat16ToFloat(p[i]) / divisor);
      return;
    }
  }
}

void CompressFloat32(const float* src, std::uint16_t* dst, std::size_t n, DType wire, float scale) {
  if (wire == DType::kFloat16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = FloatToFloat16(src[i] * scale);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i] * scale);
  }
}

void DecompressFloat32(const std::uint16_t* src, float* dst, std::size_t n, DType wire) {
  if (wire == DType::kFloat16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
  }
}

}  // namespace ddp::detail
