// Deterministic collective inputs and typed host buffers shared by the SDK's
// rank programs (tests/sdk/worker, tests/gpu/worker): every rank computes
// every other rank's input from (rank, index, salt), so each can check a
// collective's result against a local reference.
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/half.h"

namespace ddprun::test {

// Halves get small integers (sums stay exact), ints signed values, floats
// multiples of 2^-10.
inline double Value(int rank, std::size_t i, ddp::DType dtype, std::uint64_t salt) {
  std::uint64_t x = (rank + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull ^ salt;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  switch (dtype) {
    case ddp::DType::kFloat16:
    case ddp::DType::kBFloat16: return double(std::int64_t(x % 17) - 8);
    case ddp::DType::kInt32:
    case ddp::DType::kInt64: return double(std::int64_t(x % 2001) - 1000);
    default: return double(std::int64_t(x % 2000001) - 1000000) / 1024.0;
  }
}

inline bool IsInt(ddp::DType d) { return d == ddp::DType::kInt32 || d == ddp::DType::kInt64; }

// A typed host buffer of n elements held as bytes (one spare byte, so that a
// zero-element buffer still has an address).
struct TypedBuf {
  ddp::DType dtype;
  std::vector<unsigned char> bytes;
  TypedBuf(ddp::DType d, std::size_t n) : dtype(d), bytes(n * ddp::DTypeSize(d) + 1) {}
  void* data() { return bytes.data(); }
  std::size_t size_bytes() const { return bytes.size() - 1; }
  void Set(std::size_t i, double v) {
    using ddp::DType;
    using namespace ddp::detail;
    switch (dtype) {
      case DType::kFloat32: reinterpret_cast<float*>(data())[i] = float(v); break;
      case DType::kFloat64: reinterpret_cast<double*>(data())[i] = v; break;
      case DType::kInt32: reinterpret_cast<std::int32_t*>(data())[i] = std::int32_t(v); break;
      case DType::kInt64: reinterpret_cast<std::int64_t*>(data())[i] = std::int64_t(v); break;
      case DType::kFloat16:
        reinterpret_cast<std::uint16_t*>(data())[i] = FloatToFloat16(float(v));
        break;
      case DType::kBFloat16:
        reinterpret_cast<std::uint16_t*>(data())[i] = FloatToBFloat16(float(v));
        break;
    }
  }
  double Get(std::size_t i) {
    using ddp::DType;
    using namespace ddp::detail;
    switch (dtype) {
      case DType::kFloat32: return reinterpret_cast<float*>(data())[i];
      case DType::kFloat64: return reinterpret_cast<double*>(data())[i];
      case DType::kInt32: return reinterpret_cast<std::int32_t*>(data())[i];
      case DType::kInt64: return double(reinterpret_cast<std::int64_t*>(data())[i]);
      case DType::kFloat16: return Float16ToFloat(reinterpret_cast<std::uint16_t*>(data())[i]);
      case DType::kBFloat16: return BFloat16ToFloat(reinterpret_cast<std::uint16_t*>(data())[i]);
    }
    return 0;
  }
};

inline const std::vector<ddp::DType> kDTypes = {ddp::DType::kFloat32,  ddp::DType::kFloat16,
                                                ddp::DType::kBFloat16, ddp::DType::kFloat64,
                                                ddp::DType::kInt32,    ddp::DType::kInt64};
inline const std::vector<ddp::ReduceOp> kOps = {ddp::ReduceOp::kSum, ddp::ReduceOp::kAvg,
                                                ddp::ReduceOp::kMax, ddp::ReduceOp::kMin};

}  // namespace ddprun::test
