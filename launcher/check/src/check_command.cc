// `ddprun check` (check_command.h): the launcher side (the job's flags into
// one check worker per node, run by the normal agent) and the check worker.
#include "ddprun/launcher/check/check_command.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ddprun/agent/agent.h"
#include "ddprun/agent/events.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/launcher/check/preflight_exchange.h"
#include "ddprun/launcher/check/preflight_probe.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher {
namespace {

using Json = nlohmann::json;

constexpr const char* kCheckUsage =
    "usage: ddprun check [--json] [--check_timeout=SECONDS] [LAUNCHER FLAGS] SCRIPT [ARGS...]\n"
    "\n"
    "Runs a preflight of the job on every node, started like the job itself (the same\n"
    "rendezvous, nodes and job file; one check worker per node), and prints on group rank 0's\n"
    "node one table: node x check, pass / n/a / warn / fail, with the fix on warn and fail\n"
    "lines. Checks: ddprun version, script checksum, Python and PyTorch versions,\n"
    "NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, GPUs per node, /dev/shm, ulimit -n,\n"
    "ulimit -l, host names, TCP reachability (rendezvous, store, every other node) and clock\n"
    "offset. See docs/check.md.\n"
    "\n"
    "  --json                 print the report as JSON on stdout\n"
    "  --check_timeout=S      seconds to wait for the other nodes' results (default 30)\n"
    "\n"
    "Exit status: 0 every check passed, 5 warnings only, 6 a check failed, 2 usage error,\n"
    "3 the nodes could not rendezvous.\n";

struct CheckFlags {
  bool json = false;
  double timeout_s = kDefaultCheckTimeoutS;
  bool help = false;
  size_t first_launcher_arg = 2;
};

absl::StatusOr<CheckFlags> ParseCheckFlags(const std::vector<std::string>& args) {
  CheckFlags f;
  size_t i = 2;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      f.json = true;
    } else if (a == "-h" || a == "--help") {
      f.help = true;
    } else if (absl::StartsWith(a, "--check_timeout") || absl::StartsWith(a, "--check-timeout")) {
      std::string value;
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
      } else if (a == "--check_timeout" || a == "--check-timeout") {
        if (i + 1 >= args.size()) {
          return UsageError("check: --check_timeout needs a value (e.g. --check_timeout=30)");
        }
        value = args[++i];
      } else {
        break;  // some other flag
      }
      absl::StatusOr<Seconds> s = ParseSeconds(value, /*allow_zero=*/false);
      if (!s.ok()) return UsageError(absl::StrCat("check: --check_timeout ", s.status().message()));
      f.timeout_s = s->count();
    } else {
      break;
    }
  }
  f.first_launcher_arg = i;
  return f;
}

std::string SelfExe(const std::string& argv0) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? argv0 : self.string();
}

// "check.<id>": the check never joins (or restarts) the real job.
std::string CheckJobId(const std::string& id) {
  std::string out = absl::StrCat("check.", id);
  if (out.size() > rendezvous::kMaxJobIdBytes) out.resize(rendezvous::kMaxJobIdBytes);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteReport(const std::string& path, const preflight::ExchangeOutcome& o) {
  const Json j = {{"exit_code", o.exit_code}, {"text", o.text}, {"json", o.json}};
  std::ofstream outf(path, std::ios::binary | std::ios::trunc);
  outf << j.dump(-1, ' ', false, Json::error_handler_t::replace);
  return static_cast<bool>(outf);
}

const std::string* Find(const agent::Env& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

}  // namespace

int RunCheckCommand(const std::vector<std::string>& args, const agent::Env& env, std::ostream& out,
                    std::ostream& err) {
  absl::StatusOr<CheckFlags> flags = ParseCheckFlags(args);
  if (!flags.ok()) {
    err << flags.status().message() << std::endl;
    return kExitUsage;
  }
  if (flags->help) {
    out << kCheckUsage;
    return kExitSuccess;
  }
  std::vector<std::string> launcher_args{args[0]};
  launcher_args.insert(launcher_args.end(), args.begin() + flags->first_launcher_arg, args.end());
  // First, so that every thread started later inherits the mask.
  agent::BlockAgentSignals();
  auto parsed = ParseCommandLine(launcher_args, env, ProbeHost());
  if (!parsed.ok()) {
    // The check's own flags after a launcher flag read as unknown options.
    for (const std::string& a : launcher_args) {
      if (a == "--json" || absl::StartsWith(a, "--check_timeout") ||
          absl::StartsWith(a, "--check-timeout")) {
        err << "ddprun check: " << a.substr(0, a.find('='))
            << " goes right after `check`, before the launcher flags (ddprun check --json "
               "--check_timeout=S [LAUNCHER FLAGS] SCRIPT)"
            << std::endl;
        return kExitUsage;
      }
      if (a == "--") break;
    }
    if (auto unknown = UnknownSubcommandOption(
            "check", launcher_args, {"--json", "--check_timeout", "--check-timeout", "--help"})) {
      err << *unknown << std::endl;
      return kExitUsage;
    }
    err << parsed.status().message() << std::endl;
    return kExitUsage;
  }
  switch (parsed->action) {
    case Action::kHelp:
      out << kCheckUsage << "\nLauncher flags (as for a job):\n" << parsed->text << std::endl;
      return kExitSuccess;
    case Action::kVersion:
    case Action::kPrintConfig:
      out << parsed->text << std::endl;
      return kExitSuccess;
    case Action::kRun:
      break;
  }
  for (const std::string& warning : parsed->warnings) err << warning << '\n';
  err.flush();

  agent::AgentOptions options = std::move(parsed->options);
  const std::string job_id = options.job_id;
  const Json spec = {{"job_id", job_id},
                     {"command", options.command},
                     {"nproc_per_node", options.nproc_per_node},
                     {"timeout_s", flags->timeout_s}};
  char report_path[] = "/tmp/ddprun-check-XXXXXX";
  const int fd = ::mkstemp(report_path);
  if (fd < 0) {
    err << "ddprun check: cannot create a file in /tmp for the report; make /tmp writable"
        << std::endl;
    return kExitUsage;
  }
  ::close(fd);
  options.job_id = CheckJobId(job_id);
  options.nproc_per_node = 1;
  options.policy.max_restarts = 0;
  options.command = {SelfExe(args[0]), kCheckWorkerSubcommand};
  options.extra_env[kEnvCheckSpec] = spec.dump();
  options.extra_env[kEnvCheckReport] = report_path;

  int rc = 0;
  {
    agent::Agent agent(std::move(options), agent::MakeBoostProcessLauncher());
    rc = agent.Run();
  }
  const std::string text = ReadFile(report_path);
  ::unlink(report_path);
  const Json report = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("exit_code")) {
    if (rc == kExitSuccess) rc = kExitCheckFailed;
    err << "ddprun check: the check worker of this node wrote no report (ddprun exit " << rc
        << "); see the lines above" << std::endl;
    return rc;
  }
  const int code = report["exit_code"].get<int>();
  const std::string json_text = report.value("json", "");
  if (flags->json && !json_text.empty()) {
    out << json_text;
  } else {
    out << report.value("text", "");
  }
  out.flush();
  return code != kExitSuccess ? code : rc;
}

int RunCheckWorker(const agent::Env& env, std::ostream& err) {
  const std::string* spec_text = Find(env, kEnvCheckSpec);
  const std::string* report_path = Find(env, kEnvCheckReport);
  const std::string* master_addr = Find(env, "MASTER_ADDR");
  const std::string* master_port = Find(env, "MASTER_PORT");
  const std::string* group_rank = Find(env, "GROUP_RANK");
  const std::string* group_size = Find(env, "GROUP_WORLD_SIZE");
  if (!spec_text || !report_path || !master_addr || !master_port || !group_rank || !group_size) {
    err << "ddprun " << kCheckWorkerSubcommand
        << ": not started by `ddprun check`; run `ddprun check [FLAGS] SCRIPT` instead"
        << std::endl;
    return kExitUsage;
  }
  const Json spec = Json::parse(*spec_text, nullptr, /*allow_exceptions=*/false);
  preflight::ExchangeInput in;
  int store_port = 0;
  if (spec.is_discarded() || !absl::SimpleAtoi(*group_rank, &in.group_rank) ||
      !absl::SimpleAtoi(*group_size, &in.group_world_size) ||
      !absl::SimpleAtoi(*master_port, &store_port)) {
    err << "ddprun " << kCheckWorkerSubcommand << ": a malformed check environment; run the same "
        << "ddprun on every node" << std::endl;
    return kExitUsage;
  }
  const std::vector<std::string> command = spec.value("command", std::vector<std::string>{});
  in.job.job_id = spec.value("job_id", "");
  in.job.nproc_per_node = spec.value("nproc_per_node", 1);
  in.job.nnodes = in.group_world_size;
  in.timeout =
      preflight::Millis(static_cast<long>(spec.value("timeout_s", kDefaultCheckTimeoutS) * 1000));
  in.connect_timeout = std::min(in.connect_timeout, in.timeout);
  const std::string* host = Find(env, kEnvHost);
  in.host = host ? *host : *master_addr;
  if (const std::string* rdzv = Find(env, kEnvStoreAddr)) {
    if (auto hp = rendezvous::ParseHostPort(*rdzv); hp.ok()) {
      in.targets.push_back({"rendezvous", hp->host, hp->port});
    }
  }
  in.targets.push_back({"store", *master_addr, store_port});

  std::unique_ptr<preflight::SystemProbe> probe = preflight::MakeSystemProbe();
  // The Python probe gets at most half the check timeout (30 s by default),
  // so that node 0 hears from this node even when the interpreter hangs.
  const preflight::Millis python_timeout =
      std::min<preflight::Millis>(std::chrono::seconds(30), in.timeout / 2);
  auto collect = [&] { return preflight::CollectLocalFacts(*probe, command, env, python_timeout); };
  auto fail = [&](const std::string& line) {
    err << line << std::endl;
    preflight::ExchangeOutcome o;
    o.exit_code = kExitCheckFailed;
    o.text = line + "\n";
    WriteReport(*report_path, o);
    return kExitSuccess;  // the agent and the other nodes carry on; node 0 reports the gap
  };
  auto store = rendezvous::C10dStoreClient::Connect(
      *master_addr, store_port, std::chrono::duration_cast<rendezvous::Duration>(in.timeout));
  if (!store.ok()) {
    return fail(
        absl::StrCat("ddprun check: node ", in.group_rank, " cannot reach the job's store at ",
                     rendezvous::FormatHostPort(*master_addr, store_port), " (",
                     store.status().message(), "); open that TCP port from this node to node 0"));
  }
  absl::StatusOr<preflight::ExchangeOutcome> outcome =
      preflight::RunExchange(**store, *probe, collect, in);
  if (!outcome.ok()) {
    return fail(
        absl::StrCat("ddprun check: node ", in.group_rank, ": ", outcome.status().message()));
  }
  if (!WriteReport(*report_path, *outcome)) {
    err << "ddprun check: cannot write " << *report_path << "; make /tmp writable" << std::endl;
  }
  return kExitSuccess;
}

}  // namespace ddprun::launcher
