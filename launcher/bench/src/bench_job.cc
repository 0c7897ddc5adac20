// One job of `ddprun bench` (bench_job.h).
#include "bench_job.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ddprun/agent/agent.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/launcher/bench/bench_options.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::launcher::bench {

namespace fs = std::filesystem;

ResultDir::ResultDir() {
  std::string tmpl = (fs::temp_directory_path() / "ddprun-bench-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
}

ResultDir::~ResultDir() {
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

std::string ResultDir::Path(int i) const { return absl::StrCat(dir_, "/result.", i, ".json"); }

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

// The first word of `args` that is neither an option nor an option's value
// (a script given to bench), or "" when there is none. An option takes the
// next word unless it has "=VALUE" or is a switch of the knob table.
std::string FirstPositional(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return i + 1 < args.size() ? args[i + 1] : "";
    if (!absl::StartsWith(a, "-") || a == "-") return a;
    if (a.find('=') != std::string::npos) continue;
    if (!absl::StartsWith(a, "--")) {  // -r 3, -t 3: short options take a value
      if (a.size() == 2) ++i;
      continue;
    }
    std::string name = a.substr(2);
    std::replace(name.begin(), name.end(), '-', '_');
    const Knob* knob = FindKnob(name);
    if (knob != nullptr && knob->type != ValueType::kBool) ++i;
  }
  return "";
}

ParsedJob ParseJob(const std::vector<std::string>& launcher_args, const std::string& worker,
                   const std::vector<std::string>& worker_args, const Env& env,
                   const HostFacts& host, std::ostream& out, std::ostream& err) {
  ParsedJob job;
  std::vector<std::string> argv{"ddprun"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back("--no_python");
  argv.push_back(worker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  // The user's word, before the launcher reads it as a script (and names
  // the interpreter it would run it with, or says that it is not found).
  std::vector<std::string> own = kBenchFlags;
  own.push_back("--help");
  if (const std::string word = FirstPositional(launcher_args); !word.empty()) {
    // An unknown flag first: its value reads as the word ("--opp allreduce").
    if (auto unknown = UnknownSubcommandOption("bench", launcher_args, own)) {
      err << *unknown << std::endl;
      job.exit_code = kExitUsage;
      return job;
    }
    err << "ddprun bench: '" << word
        << "' is not a flag; ddprun bench runs its own worker and takes no script (write flags "
           "as --flag=value)"
        << std::endl;
    job.exit_code = kExitUsage;
    return job;
  }
  auto parsed = ParseCommandLine(argv, env, host);
  if (!parsed.ok()) {
    if (auto unknown = UnknownSubcommandOption("bench", launcher_args, own)) {
      err << *unknown << std::endl;
      job.exit_code = kExitUsage;
      return job;
    }
    err << parsed.status().message() << std::endl;
    job.exit_code = kExitUsage;
    return job;
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
    job.exit_code = kExitUsage;
    return job;
  }
  if (parsed->action != Action::kRun) {  // --version, --print-config
    out << parsed->text << std::endl;
    job.exit_code = kExitSuccess;
    return job;
  }
  job.options = std::move(parsed->options);
  return job;
}

int RunAgent(agent::AgentOptions options, const std::string& result) {
  // The workers inherit the agent's environment, read when the agent is built.
  ::setenv(kEnvBenchResult, result.c_str(), 1);
  std::remove(result.c_str());
  agent::Agent agent(std::move(options), agent::MakeBoostProcessLauncher());
  return agent.Run();
}

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
          << "hook " << kEnvBenchCorruptRank << "=" << hook->second << " asked; unset it to measure"
          << std::endl;
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

ScalingRow RowFromResult(const Json& result, int world) {
  const Json& r = result["row"];
  ScalingRow row;
  row.ranks = r.value("ranks", world);
  row.global_batch = r.value("global_batch", 0);
  row.step_ms = r.value("step_ms", 0.0);
  row.compute_ms = r.value("compute_ms", 0.0);
  row.exposed_ms = r.value("exposed_ms", 0.0);
  row.samples_per_s = r.value("samples_per_s", 0.0);
  return row;
}

}  // namespace ddprun::launcher::bench
