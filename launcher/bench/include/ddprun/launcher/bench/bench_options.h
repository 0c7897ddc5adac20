// `ddprun bench`: its own flags, the nccl-tests arithmetic (sizes, counts,
// bus bandwidth factors) and the tables it prints. Pure functions shared by
// the launcher (which checks the flags before starting anything) and the
// bench worker (which runs the collectives and prints the rows), so that one
// parser and one formatter serve both. No SDK, no sockets.
//
// Contract:
//  - SplitBenchArgs takes everything after "bench" and separates the bench
//    flags (kBenchFlags, `--flag value` or `--flag=value`) from the launcher
//    flags, which go to ParseCommandLine unchanged.
//  - Every bad value gives an InvalidArgument status with ONE line starting
//    "ddprun bench: " that names the flag, the problem and the fix.
//  - ToWorkerArgs(options) parses back to the same options (the worker's argv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::launcher::bench {

enum class Op { kAllreduce, kAllgather, kReduceScatter, kBroadcast };
// The element types of the worker SDK (ddp::DType), with nccl-tests' names.
enum class DType { kFloat, kDouble, kHalf, kBFloat16, kInt32, kInt64 };
// The reductions of the worker SDK (ddp::ReduceOp).
enum class RedOp { kSum, kAvg, kMax, kMin };

const char* OpName(Op op);        // "allreduce", ...
const char* DTypeName(DType t);   // "float", "double", "half", "bfloat16", "int32", "int64"
const char* RedOpName(RedOp op);  // "sum", "avg", "max", "min"
std::size_t DTypeSize(DType t);

struct BenchOptions {
  std::vector<Op> ops{Op::kAllreduce};
  std::size_t min_bytes = 4 << 10;  // --sizes MIN:MAX
  std::size_t max_bytes = 256 << 20;
  int step_factor = 2;  // --step_factor: each size is the previous times this
  DType dtype = DType::kFloat;
  RedOp redop = RedOp::kSum;
  int iters = 20;  // timed iterations per size and placement
  int warmup = 5;  // untimed iterations before them
  int root = 0;    // broadcast's root
  bool json = false;
  // --scaling: the synthetic data-parallel step instead of the size sweep.
  bool scaling = false;
  double compute_ms = 100;  // forward + backward time per step
  int batch = 32;           // samples per rank and step
};

// Every flag SplitBenchArgs recognises (their docs: docs/cli.md, "ddprun bench").
extern const std::vector<std::string> kBenchFlags;

struct SplitArgs {
  BenchOptions options;
  std::vector<std::string> launcher_args;  // in their original order
};
// args: what follows "bench" on the command line.
absl::StatusOr<SplitArgs> SplitBenchArgs(const std::vector<std::string>& args);
// The bench flags alone (the worker's argv after its name); anything else is an error.
absl::StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args);
std::vector<std::string> ToWorkerArgs(const BenchOptions& options);

// "4K", "256M", "1G", "1000" (K, M, G are powers of 1024).
absl::StatusOr<std::size_t> ParseByteSize(const std::string& text);
// The sweep: min, min*f, ... up to max (max included when the sweep lands on it).
std::vector<std::size_t> SweepSizes(const BenchOptions& options);

// One row of the table, as nccl-tests shapes it.
struct Shape {
  std::size_t bytes = 0;      // the "size" column: the largest buffer of the op
  std::size_t count = 0;      // the "count" column: elements per rank's call
  std::size_t in_count = 0;   // elements of each rank's input
  std::size_t out_count = 0;  // elements of each rank's output
};
// nccl-tests' rounding: allgather and reducescatter use count = bytes /
// size / world (at least 1), so `bytes` is rounded down to a multiple of it.
Shape ShapeFor(Op op, std::size_t bytes, DType dtype, int world);
// algbw -> busbw: allreduce 2(n-1)/n, allgather and reducescatter (n-1)/n, broadcast 1.
double BusBandwidthFactor(Op op, int world);

struct Timing {
  double time_us = 0;
  double algbw_gbs = 0;  // bytes / time, 1e9 bytes per second
  double busbw_gbs = 0;
  std::int64_t wrong = 0;  // elements that differ from the expected result, every rank
};
struct Row {
  Op op = Op::kAllreduce;
  Shape shape;
  DType dtype = DType::kFloat;
  RedOp redop = RedOp::kSum;
  int root = -1;  // -1 for ops without one
  Timing out_of_place, in_place;
};
Timing MakeTiming(Op op, std::size_t bytes, int world, double seconds, std::int64_t wrong);

// The table, nccl-tests' lines: a title with the job, the three header
// lines, one line per row, then "# Out of bounds values" and "# Avg bus bandwidth".
std::string FormatTitle(Op op, int world, const std::string& backend, const BenchOptions& o);
std::string FormatHeader();
std::string FormatRow(const Row& row);
// Mean busbw over every row's out-of-place and in-place figures.
double AvgBusBandwidth(const std::vector<Row>& rows);
std::string FormatFooter(const std::vector<Row>& rows);
// {"op":..., "world":..., "backend":..., "rows":[...], "wrong":..., "avg_busbw_gbs":...}
std::string FormatJson(int world, const std::string& backend, const std::vector<Row>& rows);

// --scaling: one world size.
struct ScalingRow {
  int ranks = 1;
  int global_batch = 0;
  double step_ms = 0;     // mean step, rank 0
  double compute_ms = 0;  // forward + backward (rank 0's measured time)
  double exposed_ms = 0;  // communication not hidden behind compute (Finish's wait)
  double samples_per_s = 0;
};
// Efficiency of rows[i]: its samples/s over ranks * samples/s of the 1-rank row.
std::string FormatScalingHeader(const std::string& backend, const BenchOptions& o);
std::string FormatScalingRow(const ScalingRow& row, double one_rank_samples_per_s);
std::string FormatScalingJson(const std::string& backend, const BenchOptions& o,
                              const std::vector<ScalingRow>& rows);
// The world sizes of the scaling table: 1, 2, 4, ... and `world` itself.
std::vector<int> ScalingWorlds(int world);
// Across `nodes` nodes of `nproc` ranks: ScalingWorlds(nproc) on node 0, then
// whole nodes: 2, 4, ... and `nodes` times `nproc` (2 x 8 -> 1 2 4 8 16).
std::vector<int> ScalingWorldsAcrossNodes(int nproc, int nodes);

}  // namespace ddprun::launcher::bench
