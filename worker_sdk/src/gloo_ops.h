// The Gloo algorithms the CPU backend runs, over one Gloo context each.
// Every function throws Gloo's exceptions (the communication thread turns
// them into a Status).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ddp/types.h"
#include "gloo/context.h"

namespace ddp::detail {

// Gloo's option setters are templates on the element type; only its size matters.
template <class Fn>
void WithElementType(DType dtype, Fn&& fn) {
  switch (DTypeSize(dtype)) {
    case 2: fn(std::uint16_t{}); break;
    case 4: fn(std::uint32_t{}); break;
    case 8: fn(std::uint64_t{}); break;
  }
}

// All-reduce on a sync-mode context (Gloo's rings over bound buffers; a
// blocking write per message, which suits small messages only). kAvg is
// summed, not divided. Every rank gets the same bits.
void RunSyncAllreduce(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
                      DType dtype, ReduceOp op);

// An all-reduce (kAvg not divided) over a Gloo context: on its sync-mode twin
// `sync_ctx` (may be null) when the message is small enough
// (SyncAllreduceMaxBytes of cpu_topology.h), else Gloo's async all-reduce.
void TcpAllreduce(const std::shared_ptr<gloo::Context>& ctx,
                  const std::shared_ptr<gloo::Context>& sync_ctx, std::size_t wmem_max, void* data,
                  std::size_t count, DType dtype, ReduceOp op, std::uint32_t tag, Duration timeout);

}  // namespace ddp::detail
