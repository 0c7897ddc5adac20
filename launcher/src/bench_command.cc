// `ddprun bench`: runs ddprun-bench-worker as the job's workers through the
// normal agent path and turns rank 0's summary into an exit code.
#include "ddprun/launcher/bench_command.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/agent.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/launcher/bench_options.h"
#include "ddprun/rendezvous/exit_codes.h"
#include "ddprun/rendezvous/worker_env_names.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;
namespace lb = bench;
using Json = nlohmann::json;

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
                      Reducer) at 1, 2, 4, ... ranks up to --nproc_per_node
  --compute_ms MS     --scaling: compute time per step (default 100)
  --batch N           --scaling: samples per rank and step (default 32)

Exit codes: 0 success, 1 a worker failed, 2 usage, 3 rendezvous, 4 #wrong > 0.
See docs/bench.md.
)";

// A private directory for rank 0's summary; removed when the command ends.
class ResultDir {
 public:
  ResultDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddprun-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  }
  ~ResultDir() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  bool ok() const { return !dir_.empty(); }
  std::string Path(int i) const { return absl::StrCat(dir_, "/result.", i, ".json"); }

 private:
  std::string dir_;
};

// Rank 0's summary, or null when this node had no rank 0 (or it wrote nothing).
Json ReadResult(const std::string& path) {
  std::ifstream f(path);
  if (!f) return nullptr;
  std::stringstream ss;
  ss << f.rdbuf();
  Json js = Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  return js.is_discarded() ? Json(nullptr) : js;
}

std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s.rfind("ddprun bench", 0) == 0 ? s : "ddprun bench: " + s;
}

// Runs one job of the bench worker with `launcher_args` and `worker_args`;
// rank 0's summary lands in `result`.
int RunJob(const std::vector<std::string>& launcher_args, const std::string& worker,
           const std::vector<std::string>& worker_args, const std::string& result, const Env& env,
           const HostFacts& host, std::ostream& out, std::ostream& err) {
  std::vector<std::string> argv{"ddprun"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back("--no_python");
  argv.push_back(worker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  auto parsed = ParseCommandLine(argv, env, host);
  if (!parsed.ok()) {
    err << parsed.status().message() << std::endl;
    return kExitUsage;
  }
  for (const std::string& warning : parsed->warnings) err << warning << '\n';
  err.flush();
  // A positional argument among the launcher flags became "the script".
  if (parsed->action == Action::kRun &&
      (parsed->options.command.empty() || parsed->options.command[0] != worker)) {
    err << "ddprun bench: '" << (parsed->options.command.empty() ? "" : parsed->options.command[0])
        << "' is not a flag; ddprun bench runs its own worker and takes no script (write flags "
           "as --flag=value)"
        << std::endl;
    return kExitUsage;
  }
  if (parsed->action != Action::kRun) {  // --version, --print-config
    out << parsed->text << std::endl;
    return kExitSuccess;
  }
  // The workers inherit the agent's environment, read when the agent is built.
  ::setenv(kEnvBenchResult, result.c_str(), 1);
  std::remove(result.c_str());
  agent::Agent agent(std::move(parsed->options), agent::MakeBoostProcessLauncher());
  return agent.Run();
}

// The exit code for a finished job and its summary; prints the error lines.
int Verdict(int rc, const Json& result, const Env& env, std::ostream& err) {
  if (rc != kExitSuccess || !result.is_object()) return rc;
  if (result.contains("error")) {
    err << OneLine(result["error"].get<std::string>()) << std::endl;
    return kExitUsage;
  }
  const std::int64_t wrong = result.value("wrong", std::int64_t{0});
  if (wrong > 0) {
    const auto hook = env.find(kEnvBenchCorruptRank);
    if (hook != env.end() && !hook->second.empty()) {
      err << "ddprun bench: " << wrong << " wrong element(s) in the results (#wrong), as the test "
          << "hook " << kEnvBenchCorruptRank << "=" << hook->second
          << " asked; unset it to measure" << std::endl;
    } else {
      err << "ddprun bench: " << wrong
          << " wrong element(s) in the results (#wrong); the collectives returned values that "
             "differ from the expected ones: rerun with DDP_SHM=0 to compare the TCP path, and "
             "report it"
          << std::endl;
    }
    return kExitBenchWrong;
  }
  return kExitSuccess;
}

int RunScaling(const lb::SplitArgs& split, const std::string& worker, const ResultDir& dir,
               const Env& env, const HostFacts& host, std::ostream& out, std::ostream& err) {
  // The job's shape, as the launcher resolves it (flags, PET_*, job file).
  std::vector<std::string> probe{"ddprun"};
  probe.insert(probe.end(), split.launcher_args.begin(), split.launcher_args.end());
  probe.push_back("--no_python");
  probe.push_back(worker);
  auto shape = ParseCommandLine(probe, env, host);
  if (!shape.ok()) {
    err << shape.status().message() << std::endl;
    return kExitUsage;
  }
  if (shape->action != Action::kRun) {
    out << shape->text << std::endl;
    return kExitSuccess;
  }
  if (shape->options.max_nodes != 1) {
    err << "ddprun bench --scaling: runs its world sizes as successive jobs on one node; drop "
           "--nnodes (or set it to 1) and run it on one node, and use ddprun bench without "
           "--scaling for the collectives across nodes"
        << std::endl;
    return kExitUsage;
  }
  const std::vector<std::string> worker_args = lb::ToWorkerArgs(split.options);
  std::vector<lb::ScalingRow> rows;
  std::string backend;
  int i = 0;
  for (int world : lb::ScalingWorlds(shape->options.nproc_per_node)) {
    std::vector<std::string> args = split.launcher_args;
    args.push_back(absl::StrCat("--nproc_per_node=", world));  // the last one wins
    const std::string path = dir.Path(i++);
    const int rc = RunJob(args, worker, worker_args, path, env, host, out, err);
    const Json result = ReadResult(path);
    if (const int v = Verdict(rc, result, env, err); v != kExitSuccess) return v;
    if (!result.is_object() || !result.contains("row")) {
      err << "ddprun bench --scaling: the job at " << world
          << " rank(s) ended without its figures; rerun with DDPRUN_DEBUG=sdk" << std::endl;
      return kExitWorkerFailed;
    }
    const Json& r = result["row"];
    lb::ScalingRow row;
    row.ranks = r.value("ranks", world);
    row.global_batch = r.value("global_batch", 0);
    row.step_ms = r.value("step_ms", 0.0);
    row.compute_ms = r.value("compute_ms", 0.0);
    row.exposed_ms = r.value("exposed_ms", 0.0);
    row.samples_per_s = r.value("samples_per_s", 0.0);
    rows.push_back(row);
    if (!split.options.json) {
      if (rows.size() == 1) {
        backend = result.value("backend", std::string("?"));
        out << lb::FormatScalingHeader(backend, split.options);
      }
      out << lb::FormatScalingRow(row, rows[0].samples_per_s) << std::flush;
    } else if (rows.size() == 1) {
      backend = result.value("backend", std::string("?"));
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
  ResultDir dir;
  if (!dir.ok()) {
    err << "ddprun bench: cannot create a directory in " << fs::temp_directory_path()
        << "; set TMPDIR to a writable directory" << std::endl;
    return kExitUsage;
  }
  if (split->options.scaling) return RunScaling(*split, worker, dir, env, host, out, err);
  const std::string path = dir.Path(0);
  const int rc = RunJob(split->launcher_args, worker, lb::ToWorkerArgs(split->options), path, env,
                        host, out, err);
  return Verdict(rc, ReadResult(path), env, err);
}

}  // namespace ddprun::launcher
