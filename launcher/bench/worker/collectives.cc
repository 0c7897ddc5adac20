// The collective sweep of `ddprun bench`: nccl-tests' measurement and check
// over the worker SDK's ProcessGroup.
//
// Per op and size: `warmup` untimed calls, then `iters` timed calls; the time
// is the mean per call, averaged over the ranks (as nccl-tests does). Then
// the inputs are rewritten from the pattern, the op runs once more, and every
// element of every rank's result is compared with the value computed here
// (#wrong, summed over the ranks).
//
// Placements: the SDK's allreduce and broadcast work in place only, so their
// out-of-place column is "copy the input to the output, then the in-place
// call, then wait" per call (what a caller that keeps its input pays);
// allgather and reducescatter have an input and an output, and their in-place
// column aliases them as nccl-tests does (input = output + rank * count for
// allgather, output = input + rank * count for reducescatter).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_worker.h"
#include "ddp/half.h"  // float16/bfloat16 conversions
#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::bench_worker {
namespace lb = launcher::bench;
namespace {

using Clock = std::chrono::steady_clock;

ddp::DType ToSdk(lb::DType t) {
  switch (t) {
    case lb::DType::kFloat:
      return ddp::DType::kFloat32;
    case lb::DType::kDouble:
      return ddp::DType::kFloat64;
    case lb::DType::kHalf:
      return ddp::DType::kFloat16;
    case lb::DType::kBFloat16:
      return ddp::DType::kBFloat16;
    case lb::DType::kInt32:
      return ddp::DType::kInt32;
    case lb::DType::kInt64:
      return ddp::DType::kInt64;
  }
  return ddp::DType::kFloat32;
}

ddp::ReduceOp ToSdk(lb::RedOp r) {
  switch (r) {
    case lb::RedOp::kSum:
      return ddp::ReduceOp::kSum;
    case lb::RedOp::kAvg:
      return ddp::ReduceOp::kAvg;
    case lb::RedOp::kMax:
      return ddp::ReduceOp::kMax;
    case lb::RedOp::kMin:
      return ddp::ReduceOp::kMin;
  }
  return ddp::ReduceOp::kSum;
}

// Element i of a host buffer of type t, as a double, and back (rounded to t).
double Load(lb::DType t, const void* p, std::size_t i) {
  switch (t) {
    case lb::DType::kFloat:
      return static_cast<const float*>(p)[i];
    case lb::DType::kDouble:
      return static_cast<const double*>(p)[i];
    case lb::DType::kHalf:
      return ddp::detail::Float16ToFloat(static_cast<const std::uint16_t*>(p)[i]);
    case lb::DType::kBFloat16:
      return ddp::detail::BFloat16ToFloat(static_cast<const std::uint16_t*>(p)[i]);
    case lb::DType::kInt32:
      return static_cast<const std::int32_t*>(p)[i];
    case lb::DType::kInt64:
      return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
  }
  return 0;
}

void Store(lb::DType t, void* p, std::size_t i, double v) {
  switch (t) {
    case lb::DType::kFloat:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case lb::DType::kDouble:
      static_cast<double*>(p)[i] = v;
      break;
    case lb::DType::kHalf:
      static_cast<std::uint16_t*>(p)[i] = ddp::detail::FloatToFloat16(static_cast<float>(v));
      break;
    case lb::DType::kBFloat16:
      static_cast<std::uint16_t*>(p)[i] = ddp::detail::FloatToBFloat16(static_cast<float>(v));
      break;
    case lb::DType::kInt32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      break;
    case lb::DType::kInt64:
      static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
      break;
  }
}

// Relative tolerance of the check: 0 for exact results (integers; sums, max
// and min of the small integers below are exact in every type); avg divides.
double Tolerance(lb::DType t) {
  switch (t) {
    case lb::DType::kFloat:
      return 1e-6;
    case lb::DType::kDouble:
      return 1e-12;
    case lb::DType::kHalf:
      return 2e-3;
    case lb::DType::kBFloat16:
      return 1.6e-2;
    default:
      return 0;
  }
}

// The deterministic inputs, small integers (exact in every type). Reductions:
// element i of rank r is 1 + (i + 3r) mod 4, so a sum over up to 64 ranks is
// exact even in bfloat16. Copies (allgather, broadcast): 1 + (i + 7r) mod 97,
// so that no two ranks below 97 hold the same block (a block landing at the
// wrong rank's place is counted).
double Pattern(int rank, std::size_t i) { return 1.0 + static_cast<double>((i + 3u * rank) % 4u); }
double CopyPattern(int rank, std::size_t i) {
  return 1.0 + static_cast<double>((i + 7u * rank) % 97u);
}

// The reduction of element i over every rank, as the SDK defines it.
double Reduced(lb::RedOp op, lb::DType t, int world, std::size_t i) {
  double acc = Pattern(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = Pattern(r, i);
    switch (op) {
      case lb::RedOp::kSum:
      case lb::RedOp::kAvg:
        acc += v;
        break;
      case lb::RedOp::kMax:
        acc = std::max(acc, v);
        break;
      case lb::RedOp::kMin:
        acc = std::min(acc, v);
        break;
    }
  }
  if (op == lb::RedOp::kAvg) {
    const bool integer = t == lb::DType::kInt32 || t == lb::DType::kInt64;
    acc = integer ? static_cast<double>(static_cast<std::int64_t>(acc) / world) : acc / world;
  }
  return acc;
}

// Counts the elements of `got` (host, type t) that differ from expected(i).
template <class Expected>
std::int64_t CountWrong(lb::DType t, const void* got, std::size_t n, Expected&& expected) {
  const double tol = Tolerance(t);
  std::vector<unsigned char> one(8);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Store(t, one.data(), 0, expected(i));  // rounded to t, as the SDK stores it
    const double want = Load(t, one.data(), 0);
    const double have = Load(t, got, i);
    if (!(std::abs(have - want) <= tol * std::max(1.0, std::abs(want)))) ++wrong;
  }
  return wrong;
}

// The test hook (DDPRUN_BENCH_CORRUPT_RANK): this rank alters element 0 of each checked result.
bool CorruptsResults(int rank) {
  const char* v = std::getenv(ddprun::kEnvBenchCorruptRank);
  return v != nullptr && *v != '\0' && std::atoi(v) == rank;
}

class Sweep {
 public:
  Sweep(ddp::ProcessGroup& pg, const BenchOptions& o, lb::Op op)
      : pg_(pg),
        o_(o),
        op_(op),
        mem_(pg.backend() == ddp::Backend::kNccl, pg.info().local_rank, &pg),
        n_(pg.size()),
        rank_(pg.rank()),
        t_(o.dtype),
        ws_(lb::DTypeSize(o.dtype)) {
    const std::vector<std::size_t> sizes = lb::SweepSizes(o);
    const lb::Shape big = lb::ShapeFor(op, sizes.back(), t_, n_);
    max_in_ = big.in_count;
    max_out_ = big.out_count;
    send_ = mem_.Alloc(max_in_ * ws_);
    recv_ = mem_.Alloc(max_out_ * ws_);
    work_ = mem_.Alloc(std::max(max_in_, max_out_) * ws_);
    scratch_ = mem_.Alloc(sizeof(double));
    // This rank's input pattern, built once. In host memory it lives in send_,
    // which no call writes (only the check of a broadcast zeroes it on the
    // ranks that are not the root, whose pattern is not needed again); on a
    // GPU a host copy is kept for the check's uploads and the results come
    // back into host_out_.
    void* pattern = send_;
    if (mem_.device()) {
      host_in_.resize(max_in_ * ws_);
      host_out_.resize(max_out_ * ws_);
      pattern = host_in_.data();
    }
    const bool copies = op == lb::Op::kAllgather || op == lb::Op::kBroadcast;
    for (std::size_t i = 0; i < max_in_; ++i) {
      Store(t_, pattern, i, copies ? CopyPattern(rank_, i) : Pattern(rank_, i));
    }
    pattern_ = pattern;
    mem_.ToDevice(send_, pattern_, max_in_ * ws_);  // first touch, outside the timing
    mem_.Copy(recv_, send_, std::min(max_in_, max_out_) * ws_);
    mem_.Copy(work_, send_, max_in_ * ws_);
  }
  ~Sweep() {
    mem_.Free(send_);
    mem_.Free(recv_);
    mem_.Free(work_);
    mem_.Free(scratch_);
  }

  lb::Row Measure(std::size_t bytes) {
    lb::Row row;
    row.op = op_;
    row.shape = lb::ShapeFor(op_, bytes, t_, n_);
    row.dtype = t_;
    row.redop = o_.redop;
    row.root = op_ == lb::Op::kBroadcast ? o_.root : -1;
    const std::size_t b = row.shape.bytes;
    row.out_of_place = lb::MakeTiming(op_, b, n_, Time(row.shape, false), Check(row.shape, false));
    row.in_place = lb::MakeTiming(op_, b, n_, Time(row.shape, true), Check(row.shape, true));
    return row;
  }

 private:
  // Issues one call of the op on the given placement (buffers already set up).
  ddp::Work Issue(const lb::Shape& s, bool in_place) {
    const ddp::DType dt = ToSdk(t_);
    switch (op_) {
      case lb::Op::kAllreduce:
        if (!in_place) mem_.Copy(recv_, send_, s.count * ws_);
        return pg_.Allreduce(in_place ? work_ : recv_, s.count, dt, ToSdk(o_.redop));
      case lb::Op::kBroadcast:
        if (!in_place) mem_.Copy(recv_, send_, s.count * ws_);
        return pg_.Broadcast(in_place ? work_ : recv_, s.count, dt, o_.root);
      case lb::Op::kAllgather:
        if (in_place) {
          char* out = static_cast<char*>(work_);
          return pg_.Allgather(out + rank_ * s.count * ws_, out, s.count, dt);
        }
        return pg_.Allgather(send_, recv_, s.count, dt);
      case lb::Op::kReduceScatter:
        if (in_place) {
          char* in = static_cast<char*>(work_);
          return pg_.ReduceScatter(in, in + rank_ * s.count * ws_, s.count, dt, ToSdk(o_.redop));
        }
        return pg_.ReduceScatter(send_, recv_, s.count, dt, ToSdk(o_.redop));
    }
    return ddp::Work();
  }

  // Ops whose out-of-place form copies first must wait per call (the copy
  // would otherwise race the previous call); the others are issued back to
  // back and waited for together, as nccl-tests does.
  bool WaitEachCall(bool in_place) const {
    return !in_place && (op_ == lb::Op::kAllreduce || op_ == lb::Op::kBroadcast);
  }

  void Run(const lb::Shape& s, bool in_place, int calls) {
    std::vector<ddp::Work> works;
    for (int i = 0; i < calls; ++i) {
      ddp::Work w = Issue(s, in_place);
      if (WaitEachCall(in_place)) {
        w.Wait();
      } else {
        works.push_back(std::move(w));
      }
    }
    for (ddp::Work& w : works) w.Wait();
  }

  // Mean seconds per call, averaged over the ranks.
  double Time(const lb::Shape& s, bool in_place) {
    Run(s, in_place, o_.warmup);
    pg_.Barrier().Wait();
    const auto t0 = Clock::now();
    Run(s, in_place, o_.iters);
    double sec = std::chrono::duration<double>(Clock::now() - t0).count() / o_.iters;
    return SumOverRanks(sec, ddp::DType::kFloat64) / n_;
  }

  // Rewrites the inputs, runs the op once and counts the wrong elements of every rank.
  std::int64_t Check(const lb::Shape& s, bool in_place) {
    // Inputs: the pattern where the op reads, zeros where only results land.
    void* result = in_place ? work_ : recv_;
    std::size_t result_offset = 0;  // elements
    switch (op_) {
      case lb::Op::kAllreduce:
      case lb::Op::kBroadcast:
        // Broadcast: only the root holds the pattern; the others start from zeros.
        if (op_ == lb::Op::kAllreduce || rank_ == o_.root) {
          mem_.ToDevice(send_, pattern_, s.in_count * ws_);
          mem_.ToDevice(work_, pattern_, s.in_count * ws_);
        } else {
          mem_.Zero(send_, s.in_count * ws_);
          mem_.Zero(work_, s.in_count * ws_);
        }
        mem_.Zero(recv_, s.out_count * ws_);
        break;
      case lb::Op::kAllgather:
        mem_.ToDevice(send_, pattern_, s.in_count * ws_);
        mem_.Zero(recv_, s.out_count * ws_);
        mem_.Zero(work_, s.out_count * ws_);
        if (in_place) {
          mem_.ToDevice(static_cast<char*>(work_) + rank_ * s.count * ws_, pattern_, s.count * ws_);
        }
        break;
      case lb::Op::kReduceScatter:
        mem_.ToDevice(send_, pattern_, s.in_count * ws_);
        mem_.Zero(recv_, s.out_count * ws_);
        mem_.ToDevice(work_, pattern_, s.in_count * ws_);
        if (in_place) result_offset = rank_ * s.count;
        break;
    }
    pg_.Barrier().Wait();
    Issue(s, in_place).Wait();
    void* got = static_cast<char*>(result) + result_offset * ws_;
    if (mem_.device()) {
      mem_.ToHost(host_out_.data(), got, s.out_count * ws_);
      got = host_out_.data();
    }
    if (CorruptsResults(rank_)) Store(t_, got, 0, Load(t_, got, 0) + 1);

    std::int64_t wrong = 0;
    const lb::RedOp r = o_.redop;
    switch (op_) {
      case lb::Op::kAllreduce:
        wrong =
            CountWrong(t_, got, s.out_count, [&](std::size_t i) { return Reduced(r, t_, n_, i); });
        break;
      case lb::Op::kBroadcast:
        wrong = CountWrong(t_, got, s.out_count,
                           [&](std::size_t i) { return CopyPattern(o_.root, i); });
        break;
      case lb::Op::kAllgather:
        wrong = CountWrong(t_, got, s.out_count, [&](std::size_t i) {
          return CopyPattern(static_cast<int>(i / s.count), i % s.count);
        });
        break;
      case lb::Op::kReduceScatter:
        wrong = CountWrong(t_, got, s.out_count,
                           [&](std::size_t i) { return Reduced(r, t_, n_, rank_ * s.count + i); });
        break;
    }
    return SumOverRanks(wrong, ddp::DType::kInt64);
  }

  // One value summed over the ranks, through the group's memory (device memory on NCCL).
  template <class T>
  T SumOverRanks(T v, ddp::DType dt) {
    mem_.ToDevice(scratch_, &v, sizeof(T));
    pg_.Allreduce(scratch_, 1, dt).Wait();
    mem_.ToHost(&v, scratch_, sizeof(T));
    return v;
  }

  ddp::ProcessGroup& pg_;
  const BenchOptions& o_;
  lb::Op op_;
  Memory mem_;
  int n_, rank_;
  lb::DType t_;
  std::size_t ws_;
  std::size_t max_in_ = 0, max_out_ = 0;
  std::vector<unsigned char> host_in_, host_out_;  // GPU only
  const void* pattern_ = nullptr;                  // this rank's input, host memory
  void* send_ = nullptr;
  void* recv_ = nullptr;
  void* work_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

CollectiveSummary RunCollectives(ddp::ProcessGroup& pg, const BenchOptions& o) {
  const bool print = pg.rank() == 0;
  const std::string backend = BackendLabel(pg);
  const bool broadcast = std::find(o.ops.begin(), o.ops.end(), lb::Op::kBroadcast) != o.ops.end();
  if (broadcast && o.root >= pg.size()) {
    throw ddp::InvalidArgumentError("ddprun bench: --root " + std::to_string(o.root) +
                                    " is not a rank of this job of " + std::to_string(pg.size()) +
                                    " rank(s); pass --root between 0 and " +
                                    std::to_string(pg.size() - 1));
  }
  std::vector<lb::Row> all;
  for (lb::Op op : o.ops) {
    if (print && !o.json) {
      std::fputs((lb::FormatTitle(op, pg.size(), backend, o) + lb::FormatHeader()).c_str(), stdout);
      std::fflush(stdout);
    }
    std::vector<lb::Row> rows;
    {
      Sweep sweep(pg, o, op);
      for (std::size_t bytes : lb::SweepSizes(o)) {
        rows.push_back(sweep.Measure(bytes));
        if (print && !o.json) {
          std::fputs(lb::FormatRow(rows.back()).c_str(), stdout);
          std::fflush(stdout);
        }
      }
    }
    if (print && !o.json) {
      std::fputs(lb::FormatFooter(rows).c_str(), stdout);
      std::fflush(stdout);
    }
    all.insert(all.end(), rows.begin(), rows.end());
  }
  if (print && o.json) {
    std::fputs(lb::FormatJson(pg.size(), backend, all).c_str(), stdout);
    std::fflush(stdout);
  }
  CollectiveSummary summary;
  for (const lb::Row& r : all) summary.wrong += r.out_of_place.wrong + r.in_place.wrong;
  summary.avg_busbw_gbs = lb::AvgBusBandwidth(all);
  return summary;
}

}  // namespace ddprun::bench_worker
