// ddprun-bench-worker: the program each rank of `ddprun bench` runs
// (bench_worker.h has the protocol with the launcher). Not meant to be run
// by hand: `ddprun bench` starts it with its flags.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench_worker.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "nlohmann/json.hpp"

namespace {

namespace lb = ddprun::launcher::bench;
using Json = nlohmann::ordered_json;

// Rank 0's summary for the launcher, in $DDPRUN_BENCH_RESULT when set.
void WriteResult(const Json& js) {
  const char* path = std::getenv(ddprun::kEnvBenchResult);
  if (path == nullptr || *path == '\0') return;
  std::ofstream f(path, std::ios::trunc);
  f << js.dump() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = lb::ParseBenchArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    std::cerr << parsed.status().message() << std::endl;
    return 2;
  }
  int rank = -1;
  try {
    std::shared_ptr<ddp::ProcessGroup> pg = ddp::Init();
    rank = pg->rank();
    const std::string backend = ddprun::bench_worker::BackendLabel(*pg);
    if (parsed->scaling) {
      std::int64_t wrong = 0;
      const lb::ScalingRow row = ddprun::bench_worker::RunScaling(pg, *parsed, &wrong);
      if (rank == 0) {
        WriteResult({{"backend", backend},
                     {"wrong", wrong},
                     {"row",
                      {{"ranks", row.ranks},
                       {"global_batch", row.global_batch},
                       {"step_ms", row.step_ms},
                       {"compute_ms", row.compute_ms},
                       {"exposed_ms", row.exposed_ms},
                       {"samples_per_s", row.samples_per_s}}}});
      }
    } else {
      const auto summary = ddprun::bench_worker::RunCollectives(*pg, *parsed);
      if (rank == 0) {
        WriteResult({{"backend", backend},
                     {"wrong", summary.wrong},
                     {"avg_busbw_gbs", summary.avg_busbw_gbs}});
      }
    }
    return 0;
  } catch (const ddp::Error& e) {
    // A request this group cannot run (the same on every rank): one line for
    // the launcher, and a clean exit so that no failure report hides it.
    const bool request =
        e.code() == ddp::ErrorCode::kInvalidArgument || e.code() == ddp::ErrorCode::kUnsupported;
    if (request && rank <= 0) WriteResult({{"error", e.what()}});
    if (request && rank >= 0) return 0;
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
