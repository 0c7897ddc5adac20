// `ddprun bench`: runs ddprun-bench-worker as the job's workers through the
// normal agent path and turns rank 0's summary into an exit code.
#include "ddprun/launcher/bench/bench_command.h"

#include <unistd.h>

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench_job.h"
#include "bench_scaling_nodes.h"
#include "ddprun/launcher/bench/bench_options.h"
#include "ddprun/rendezvous/common/exit_codes.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;
namespace lb = bench;

constexpr const char* kWorkerName = "ddprun-bench-worker";

constexpr const char* kBenchHelp = R"(Usage: ddprun bench [BENCH FLAGS] [LAUNCHER FLAGS]

Runs the worker SDK's collectives across the job's real workers (started like
a training job, with every launcher flag: --nproc_per_node, --nnodes,
--rdzv_*, --config ...) and prints nccl-tests' table.

  --op OP[,OP]        allreduce (default), allgather, reducescatter, broadcast, all
  --sizes MIN:MAX     size sweep in bytes, K/M/G suffixes (default 4K:256M)
  --step_factor F     each size is the previous times F (default 2)
  --dtype T           float (default), double, half, bfloat16, int32, int64
  --redop R           sum (default), avg, max, min
  --iters N           timed calls per size (default 20)
  --warmup N          untimed calls before them (default 5)
  --root R            broadcast's root rank (default 0)
  --json              one JSON document instead of the table
  --scaling           a synthetic data-parallel step (ResNet-50 gradients, the
                      Reducer) at 1, 2, 4, ... ranks up to --nproc_per_node on
                      node 0, then on 2, 4, ... nodes up to --nnodes
  --compute_ms MS     --scaling: compute time per step (default 100)
  --batch N           --scaling: samples per rank and step (default 32)

Exit codes: 0 success, 1 a worker failed, 2 usage, 3 rendezvous, 4 #wrong > 0.
See docs/bench.md.
)";

int RunScaling(const lb::SplitArgs& split, const std::string& worker, const lb::ResultDir& dir,
               const Env& env, const HostFacts& host, std::ostream& out, std::ostream& err) {
  // The job's shape, as the launcher resolves it (flags, PET_*, job file).
  lb::ParsedJob shape = lb::ParseJob(split.launcher_args, worker, {}, env, host, out, err);
  if (shape.exit_code >= 0) return shape.exit_code;
  const std::vector<std::string> worker_args = lb::ToWorkerArgs(split.options);
  if (shape.options.max_nodes != 1) {
    return lb::RunScalingAcrossNodes(split.launcher_args, worker, worker_args,
                                     std::move(shape.options), err);
  }
  std::vector<lb::ScalingRow> rows;
  std::string backend;
  int i = 0;
  for (int world : lb::ScalingWorlds(shape.options.nproc_per_node)) {
    std::vector<std::string> args = split.launcher_args;
    args.push_back(absl::StrCat("--nproc_per_node=", world));  // the last one wins
    const std::string path = dir.Path(i++);
    lb::ParsedJob job = lb::ParseJob(args, worker, worker_args, env, host, out, err);
    if (job.exit_code >= 0) return job.exit_code;
    const int rc = lb::RunAgent(std::move(job.options), path);
    const lb::Json result = lb::ReadResult(path);
    if (const int v = lb::Verdict(rc, result, env, err); v != kExitSuccess) return v;
    if (!result.is_object() || !result.contains("row")) {
      err << "ddprun bench --scaling: the job at " << world
          << " rank(s) ended without its figures; rerun with DDPRUN_DEBUG=sdk" << std::endl;
      return kExitWorkerFailed;
    }
    rows.push_back(lb::RowFromResult(result, world));
    if (rows.size() == 1) backend = result.value("backend", std::string("?"));
    if (!split.options.json) {
      if (rows.size() == 1) out << lb::FormatScalingHeader(backend, split.options);
      out << lb::FormatScalingRow(rows.back(), rows[0].samples_per_s) << std::flush;
    }
  }
  if (split.options.json) out << lb::FormatScalingJson(backend, split.options, rows);
  return kExitSuccess;
}

}  // namespace

std::string FindBenchWorker(const std::string& self_exe) {
  const fs::path dir = fs::path(self_exe).parent_path();
  for (const fs::path& p : {dir / kWorkerName, dir / ".." / "libexec" / "ddprun" / kWorkerName}) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0) {
      return fs::weakly_canonical(p, ec).string();
    }
  }
  return "";
}

int RunBenchCommand(const std::vector<std::string>& args, const Env& env, const HostFacts& host,
                    std::ostream& out, std::ostream& err) {
  const std::vector<std::string> rest(args.begin() + std::min<std::size_t>(2, args.size()),
                                      args.end());
  for (const std::string& a : rest) {
    if (a == "--help" || a == "-h") {
      out << kBenchHelp;
      return kExitSuccess;
    }
  }
  auto split = lb::SplitBenchArgs(rest);
  if (!split.ok()) {
    err << split.status().message() << std::endl;
    return kExitUsage;
  }
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  const std::string worker = FindBenchWorker(self);
  if (worker.empty()) {
    err << "ddprun bench: the bench worker " << kWorkerName << " is not next to " << self
        << " nor in ../libexec/ddprun/; build it (cmake --build BUILD --target " << kWorkerName
        << ") or reinstall ddprun" << std::endl;
    return kExitUsage;
  }
  lb::ResultDir dir;
  if (!dir.ok()) {
    err << "ddprun bench: cannot create a directory in " << fs::temp_directory_path()
        << "; set TMPDIR to a writable directory" << std::endl;
    return kExitUsage;
  }
  if (split->options.scaling) return RunScaling(*split, worker, dir, env, host, out, err);
  const std::string path = dir.Path(0);
  lb::ParsedJob job = lb::ParseJob(split->launcher_args, worker, lb::ToWorkerArgs(split->options),
                                   env, host, out, err);
  if (job.exit_code >= 0) return job.exit_code;
  const int rc = lb::RunAgent(std::move(job.options), path);
  return lb::Verdict(rc, lb::ReadResult(path), env, err);
}

}  // namespace ddprun::launcher
