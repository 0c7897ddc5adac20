// The entry point of lib/libddprun_grpc.so (agent/include/ddprun/agent/
// grpc_module.h): everything of ddprun that needs gRPC, behind one table of
// functions that bin/ddprun loads with dlopen on first need. The agent's
// part comes from agent/src/grpc_module_linked.cc; `ddprun status` and
// `ddprun top` are added here.
#include "ddprun/agent/grpc_module.h"
#include "ddprun/launcher/client/status_command.h"
#include "ddprun/launcher/client/top_command.h"

extern "C" const ddprun::agent::GrpcModule* ddprun_grpc_module_linked();

namespace {

const ddprun::agent::GrpcModule kModule = [] {
  ddprun::agent::GrpcModule m = *ddprun_grpc_module_linked();
  m.run_status_command = &ddprun::launcher::RunStatusCommand;
  m.run_top_command = &ddprun::launcher::RunTopCommand;
  return m;
}();

}  // namespace

extern "C" __attribute__((visibility("default"))) const ddprun::agent::GrpcModule*
ddprun_grpc_module() {
  return &kModule;
}
