#include "gloo_ops.h"

#include "cpu_topology.h"
#include "ddp/half.h"
#include "elementwise.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"

namespace ddp::detail {
namespace {

// In-place reductions for Gloo's bound-buffer algorithms: x = op(x, y).
template <class T, class Op>
void ReduceInPlace(T* x, const T* y, std::size_t n) {
  Op op;
  for (std::size_t i = 0; i < n; ++i) x[i] = op(x[i], y[i]);
}

template <float (*ToF)(std::uint16_t), std::uint16_t (*FromF)(float), class Op>
void ReduceHalfInPlace(std::uint16_t* x, const std::uint16_t* y, std::size_t n) {
  Op op;
  for (std::size_t i = 0; i < n; ++i) x[i] = FromF(op(ToF(x[i]), ToF(y[i])));
}

struct Plus {
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> T operator()(T a, T b) const { return a < b ? b : a; }
};
struct Min {
  template <class T> T operator()(T a, T b) const { return b < a ? b : a; }
};

// A ReductionFunction for the sync path, one static per (type, op).
template <class T, void (*Fn)(T*, const T*, std::size_t)>
const gloo::ReductionFunction<T>* SyncFn() {
  static const gloo::ReductionFunction<T> f(gloo::CUSTOM, Fn);
  return &f;
}

// Gloo's bound-buffer rings, for the sync-mode context. Two ranks:
// AllreduceRing, which sends the whole buffer once each way (a + b == b + a,
// so both ranks get the same bits). More: AllreduceRingChunked, a
// reduce-scatter then an allgather around the ring, so each chunk is summed
// once, in one order, and every rank receives the same bits (AllreduceRing
// would have each rank add in its own order and replicas drift apart).
template <class T>
void RunRingOf(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
               const gloo::ReductionFunction<T>* fn) {
  if (ctx->size == 2) {
    gloo::AllreduceRing<T> ring(ctx, {static_cast<T*>(data)}, static_cast<int>(count), fn);
    ring.run();
  } else {
    gloo::AllreduceRingChunked<T> ring(ctx, {static_cast<T*>(data)}, static_cast<int>(count),
                                       fn);
    ring.run();
  }
}

template <class T, class Op>
void RunSyncRing(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count) {
  RunRingOf<T>(ctx, data, count, SyncFn<T, &ReduceInPlace<T, Op>>());
}

template <class Op>
void RunSyncHalfRing(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
                     bool bf16) {
  using U = std::uint16_t;
  const gloo::ReductionFunction<U>* fn =
      bf16 ? SyncFn<U, &ReduceHalfInPlace<BFloat16ToFloat, FloatToBFloat16, Op>>()
           : SyncFn<U, &ReduceHalfInPlace<Float16ToFloat, FloatToFloat16, Op>>();
  RunRingOf<U>(ctx, data, count, fn);
}

template <class Op>
void RunSyncAllreduceOp(const std::shared_ptr<gloo::Context>& ctx, void* data,
                        std::size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return RunSyncRing<float, Op>(ctx, data, count);
    case DType::kFloat64: return RunSyncRing<double, Op>(ctx, data, count);
    case DType::kInt32: return RunSyncRing<std::int32_t, Op>(ctx, data, count);
    case DType::kInt64: return RunSyncRing<std::int64_t, Op>(ctx, data, count);
    case DType::kFloat16: return RunSyncHalfRing<Op>(ctx, data, count, false);
    case DType::kBFloat16: return RunSyncHalfRing<Op>(ctx, data, count, true);
  }
}

}  // namespace

void RunSyncAllreduce(const std::shared_ptr<gloo::Context>& ctx, void* data, std::size_t count,
                      DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return RunSyncAllreduceOp<Plus>(ctx, data, count, dtype);
    case ReduceOp::kMax: return RunSyncAllreduceOp<Max>(ctx, data, count, dtype);
    case ReduceOp::kMin: return RunSyncAllreduceOp<Min>(ctx, data, count, dtype);
  }
}

void TcpAllreduce(const std::shared_ptr<gloo::Context>& ctx,
                  const std::shared_ptr<gloo::Context>& sync_ctx, std::size_t wmem_max, void* data,
                  std::size_t count, DType dtype, ReduceOp op, std::uint32_t tag,
                  Duration timeout) {
  if (ctx->size == 1) return;
  if (sync_ctx && count * DTypeSize(dtype) <= SyncAllreduceMaxBytes(wmem_max, ctx->size)) {
    RunSyncAllreduce(sync_ctx, data, count, dtype, op);
    return;
  }
  gloo::AllreduceOptions opts(ctx);
  WithElementType(dtype, [&](auto e) { opts.setOutput(static_cast<decltype(e)*>(data), count); });
  opts.setReduceFunction(ReduceFunc(dtype, op));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace ddp::detail
