// One job of `ddprun bench`: what the one-node command (bench_command.cc) and
// the scaling run across nodes (bench_scaling_nodes.cc) share: the private
// directory for rank 0's summary, running the bench worker through the normal
// agent, and turning a finished job and its summary into an exit code.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/launcher/bench/bench_options.h"
#include "ddprun/launcher/cli.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher::bench {

using Json = nlohmann::json;

// A private temporary directory, removed with the object.
class ResultDir {
 public:
  ResultDir();
  ~ResultDir();
  ResultDir(const ResultDir&) = delete;
  ResultDir& operator=(const ResultDir&) = delete;
  bool ok() const { return !dir_.empty(); }
  std::string Path(int i) const;

 private:
  std::string dir_;
};

// A JSON file, or null when it is missing or not JSON.
Json ReadResult(const std::string& path);

// `s` on one line, starting "ddprun bench".
std::string OneLine(std::string s);

// The job's AgentOptions from the user's launcher flags, with the bench worker
// and its flags as the workers' command. An exit code (usage, or success after
// printing --version / --print-config) when there is no job to run.
struct ParsedJob {
  agent::AgentOptions options;
  int exit_code = -1;  // >= 0: no job, return this
};
ParsedJob ParseJob(const std::vector<std::string>& launcher_args, const std::string& worker,
                   const std::vector<std::string>& worker_args, const Env& env,
                   const HostFacts& host, std::ostream& out, std::ostream& err);

// Runs this node's agent for `options`; rank 0's summary lands in `result`
// (passed to the workers as DDPRUN_BENCH_RESULT). The agent's exit code.
int RunAgent(agent::AgentOptions options, const std::string& result);

// The exit code for a finished job and its summary; prints the error lines.
int Verdict(int rc, const Json& result, const Env& env, std::ostream& err);

// A scaling row from rank 0's summary (world: the job's size, if it says none).
ScalingRow RowFromResult(const Json& result, int world);

}  // namespace ddprun::launcher::bench
