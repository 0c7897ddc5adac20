// The entry point of lib/libddprun_grpc.so (agent/include/ddprun/agent/
// grpc_module.h): everything of ddprun that needs gRPC, behind one table of
// functions that bin/ddprun loads with dlopen on first need.
#include <memory>

#include "ddprun/agent/grpc_module.h"
#include "ddprun/launcher/status_command.h"
#include "ddprun/rendezvous/server.h"

namespace ddprun::launcher {
namespace {

class ServedTableImpl final : public agent::ServedTable {
 public:
  explicit ServedTableImpl(std::unique_ptr<rendezvous::RendezvousServer> server)
      : server_(std::move(server)) {}
  void HandOver(int fd) override { server_->HandOver(fd); }
  void Shutdown() override { server_->Shutdown(); }

 private:
  std::unique_ptr<rendezvous::RendezvousServer> server_;
};

absl::StatusOr<std::unique_ptr<agent::ServedTable>> ServeTable(rendezvous::JobTable& table,
                                                               int port) {
  rendezvous::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.table = &table;
  so.external_connections = true;
  auto server = rendezvous::RendezvousServer::Start(so);
  if (!server.ok()) return server.status();
  return std::unique_ptr<agent::ServedTable>(new ServedTableImpl(std::move(*server)));
}

const agent::GrpcModule kModule = [] {
  agent::GrpcModule m;
  m.make_session = &agent::MakeGrpcRendezvousSession;
  m.serve_table = &ServeTable;
  m.run_status_command = &RunStatusCommand;
  return m;
}();

}  // namespace
}  // namespace ddprun::launcher

extern "C" __attribute__((visibility("default"))) const ddprun::agent::GrpcModule*
ddprun_grpc_module() {
  return &ddprun::launcher::kModule;
}
