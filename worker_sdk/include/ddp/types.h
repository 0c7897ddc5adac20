// Element types, reduction ops and small value types of the worker SDK.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ddp {

using Duration = std::chrono::milliseconds;

// The numeric values are part of the C ABI (ddp_dtype_t); never renumber.
enum class DType : int {
  kFloat32 = 0,
  kFloat16 = 1,   // IEEE 754 binary16
  kBFloat16 = 2,  // bfloat16 (the upper half of a float32)
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

// The numeric values are part of the C ABI (ddp_reduce_op_t).
enum class ReduceOp : int {
  kSum = 0,
  kAvg = 1,  // sum / world size; integer types divide with truncation
  kMax = 2,
  kMin = 3,
};

enum class Backend : int {
  kAuto = 0,  // NCCL when built with CUDA and a GPU is visible, else Gloo
  kGloo = 1,
  kNccl = 2,
};

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
};

std::size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);
const char* BackendName(Backend backend);
// True for the values the enum names (used to validate C and Python input).
bool IsValidDType(int dtype);
bool IsValidReduceOp(int op);

}  // namespace ddp
