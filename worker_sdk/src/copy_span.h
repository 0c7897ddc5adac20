// One copy of a batch (Backend::CopyMany, cuda::LaunchCopyBatch): `bytes`
// from `src` to `dst`. Plain C++, no CUDA header, so that both the backend
// interface and the kernels' launcher use the same type.
#pragma once

#include <cstddef>

namespace ddp::detail {

struct CopySpan {
  void* dst;
  const void* src;
  std::size_t bytes;
};

}  // namespace ddp::detail
