// ddprun: parse the command line into AgentOptions and run this node's agent.
// Exit status: 0 success, 1 a worker failed, 2 usage error, 3 rendezvous
// error, 128+N killed by signal N; `ddprun check` adds 5 and 6 (see docs/cli.md).
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ddprun/agent/agent.h"
#include "ddprun/agent/grpc_module.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/launcher/bench/bench_command.h"
#include "ddprun/launcher/check/check_command.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/completion.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/suggest.h"

namespace {

// Writes `text` and a newline to stderr in one write(2), so that ddprun
// processes sharing a stderr (mpirun and srun merge their tasks' output)
// never tear each other's lines (`std::cerr << text << std::endl` is two).
void ErrLine(absl::string_view text) {
  const std::string line = absl::StrCat(text, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// `ddprun status` and `ddprun top` are gRPC clients: they live in the gRPC
// module (agent/include/ddprun/agent/grpc_module.h), loaded here.
int RunClientCommand(const char* name, ddprun::agent::GrpcModule::Command command, int argc,
                     char** argv) {
  auto module = ddprun::agent::LoadGrpcModule();
  if (module.ok() && (*module)->*command == nullptr) {
    module = absl::FailedPreconditionError(absl::StrCat("this build has no `ddprun ", name, "`"));
  }
  if (!module.ok()) {
    std::cerr << "ddprun " << name << ": " << module.status().message() << std::endl;
    return ddprun::kExitRendezvousError;
  }
  return ((*module)->*command)(std::vector<std::string>(argv, argv + argc), std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  // Two heap arenas, the main thread's and one shared by every other
  // thread: glibc's default (one per thread) maps and faults in a fresh
  // arena in each of the agent's threads at start (docs/launch.md).
  ::mallopt(M_ARENA_MAX, 2);
  // `ddprun status|top|check|bench|completion ...` are subcommands; anything
  // else is a training job.
  if (argc > 1 && std::string(argv[1]) == "status") {
    return RunClientCommand("status", &ddprun::agent::GrpcModule::run_status_command, argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "top") {
    return RunClientCommand("top", &ddprun::agent::GrpcModule::run_top_command, argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == ddprun::launcher::kCompletionSubcommand) {
    return ddprun::launcher::RunCompletionCommand(std::vector<std::string>(argv, argv + argc),
                                                  std::cout, std::cerr);
  }
  // `ddprun check ...`: a preflight run like the job (check_command.h); its
  // worker is this binary again.
  if (argc > 1 && std::string(argv[1]) == ddprun::launcher::kCheckSubcommand) {
    return ddprun::launcher::RunCheckCommand(std::vector<std::string>(argv, argv + argc),
                                             ddprun::agent::CurrentEnvironment(), std::cout,
                                             std::cerr);
  }
  if (argc > 1 && std::string(argv[1]) == ddprun::launcher::kCheckWorkerSubcommand) {
    return ddprun::launcher::RunCheckWorker(ddprun::agent::CurrentEnvironment(), std::cerr);
  }
  // First, so that every thread started later inherits the mask.
  ddprun::agent::BlockAgentSignals();
  if (argc > 1 && std::string(argv[1]) == "bench") {
    return ddprun::launcher::RunBenchCommand(std::vector<std::string>(argv, argv + argc),
                                             ddprun::agent::CurrentEnvironment(),
                                             ddprun::launcher::ProbeHost(), std::cout, std::cerr);
  }
  // One node's side of `ddprun bench --scaling` across nodes (a hidden worker).
  if (argc > 1 && std::string(argv[1]) == ddprun::launcher::kBenchScalingNodeSubcommand) {
    return ddprun::launcher::RunBenchScalingNode(
        ddprun::agent::CurrentEnvironment(), ddprun::launcher::ProbeHost(), std::cout, std::cerr);
  }

  auto parsed = ddprun::launcher::ParseCommandLine(argc, argv, ddprun::agent::CurrentEnvironment(),
                                                   ddprun::launcher::ProbeHost());
  if (!parsed.ok()) {
    // `ddprun statsu ...`: a subcommand's typo rather than a missing script.
    if (argc > 1 && argv[1][0] != '-' && ::access(argv[1], F_OK) != 0) {
      const std::string closest = ddprun::rendezvous::ClosestMatch(
          argv[1], {"status", "top", ddprun::launcher::kCheckSubcommand, "bench"});
      if (!closest.empty()) {
        ErrLine(absl::StrCat("ddprun: '", argv[1],
                             "' is neither a command nor a file (did you mean ddprun ", closest,
                             "?); see ddprun --help"));
        return ddprun::kExitUsage;
      }
    }
    ErrLine(parsed.status().message());
    return ddprun::kExitUsage;
  }
  switch (parsed->action) {
    case ddprun::launcher::Action::kHelp:
    case ddprun::launcher::Action::kPrintConfig:
      for (const std::string& warning : parsed->warnings) ErrLine(warning);
      std::cout << parsed->text << std::endl;
      return ddprun::kExitSuccess;
    case ddprun::launcher::Action::kVersion: {
      // The version, the build, and whether the install is whole: the gRPC
      // module (and every library it needs) loads, or one line says what is
      // missing (a partial wheel or .deb install; docs/install.md).
      std::cout << parsed->text << std::endl;
      auto module = ddprun::agent::LoadGrpcModule();
      if (!module.ok()) {
        std::cerr << "ddprun: broken install: " << module.status().message() << std::endl;
        return ddprun::kExitRendezvousError;
      }
      std::cout << "gRPC module: loaded" << std::endl;
      // NCCL is the SDK's, loaded at run time: not found is a fact, not a broken install.
      if (const std::string nccl = ddprun::launcher::NcclRuntimeString(); !nccl.empty()) {
        std::cout << nccl << std::endl;
      }
      return ddprun::kExitSuccess;
    }
    case ddprun::launcher::Action::kRun:
      break;
  }
  for (const std::string& warning : parsed->warnings) ErrLine(warning);

  ddprun::agent::Agent agent(std::move(parsed->options), ddprun::agent::MakeBoostProcessLauncher());
  const int rc = agent.Run();
  // Everything another process or the user sees is done (Agent::Run); what
  // the destructors would add is joining the agent's threads one after
  // another, ~2 ms of every launch (docs/launch.md): the process ends here.
  std::fflush(nullptr);
  std::_Exit(rc);
}
