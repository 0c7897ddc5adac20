// ddprun: parse the command line into AgentOptions and run this node's agent.
// Exit status: 0 success, 1 a worker failed, 2 usage error, 3 rendezvous
// error, 128+N killed by signal N (see docs/cli.md).
#include <iostream>
#include <string>
#include <vector>
#include <utility>

#include "ddprun/agent/agent.h"
#include "ddprun/agent/grpc_module.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/rendezvous/exit_codes.h"

int main(int argc, char** argv) {
  // `ddprun status ...` is a subcommand (a gRPC client, in the gRPC module:
  // agent/include/ddprun/agent/grpc_module.h); anything else is a training job.
  if (argc > 1 && std::string(argv[1]) == "status") {
    auto module = ddprun::agent::LoadGrpcModule();
    if (module.ok() && (*module)->run_status_command == nullptr) {
      module = absl::FailedPreconditionError("this build has no `ddprun status`");
    }
    if (!module.ok()) {
      std::cerr << "ddprun status: " << module.status().message() << std::endl;
      return ddprun::kExitRendezvousError;
    }
    return (*module)->run_status_command(std::vector<std::string>(argv, argv + argc), std::cout,
                                         std::cerr);
  }
  // First, so that every thread started later inherits the mask.
  ddprun::agent::BlockAgentSignals();

  auto parsed = ddprun::launcher::ParseCommandLine(argc, argv, ddprun::agent::CurrentEnvironment(),
                                                   ddprun::launcher::ProbeHost());
  if (!parsed.ok()) {
    std::cerr << parsed.status().message() << std::endl;
    return ddprun::kExitUsage;
  }
  switch (parsed->action) {
    case ddprun::launcher::Action::kHelp:
    case ddprun::launcher::Action::kPrintConfig:
      for (const std::string& warning : parsed->warnings) std::cerr << warning << '\n';
      [[fallthrough]];
    case ddprun::launcher::Action::kVersion:
      std::cout << parsed->text << std::endl;
      return ddprun::kExitSuccess;
    case ddprun::launcher::Action::kRun:
      break;
  }
  for (const std::string& warning : parsed->warnings) std::cerr << warning << '\n';
  std::cerr.flush();

  ddprun::agent::Agent agent(std::move(parsed->options), ddprun::agent::MakeBoostProcessLauncher());
  return agent.Run();
}
