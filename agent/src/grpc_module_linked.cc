// The gRPC module's table for programs that link the gRPC session in
// (ddprun_agent: the tests, the benches, and lib/libddprun_grpc.so itself).
// LoadGrpcModule() uses it instead of loading the module, which would
// register the same generated protobuf files a second time (fatal).
#include <memory>

#include "ddprun/agent/grpc_module.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/monitoring/web_config.h"
#include "ddprun/rendezvous/monitoring/web_server.h"

namespace ddprun::agent {
namespace {

class ServedTableImpl final : public ServedTable {
 public:
  explicit ServedTableImpl(std::unique_ptr<rendezvous::RendezvousServer> server)
      : server_(std::move(server)) {}
  void HandOver(int fd) override { server_->HandOver(fd); }
  void Shutdown() override { server_->Shutdown(); }

 private:
  std::unique_ptr<rendezvous::RendezvousServer> server_;
};

absl::StatusOr<std::unique_ptr<ServedTable>> ServeTable(rendezvous::JobTable& table,
                                                        rendezvous::MetricsHub& hub, int port) {
  rendezvous::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.table = &table;
  so.hub = &hub;
  so.log_prefix = "ddprun: ";
  so.external_connections = true;
  auto server = rendezvous::RendezvousServer::Start(so);
  if (!server.ok()) return server.status();
  return std::unique_ptr<ServedTable>(new ServedTableImpl(std::move(*server)));
}

absl::StatusOr<rendezvous::WebSecurity> LoadWeb(const std::string& file,
                                                const std::string& source) {
  auto config = rendezvous::ReadWebConfig(file, source);
  if (!config.ok()) return config.status();
  return rendezvous::LoadWebSecurity(*config, file, source);
}

absl::StatusOr<std::unique_ptr<rendezvous::HttpServer>> StartMonitoring(
    const rendezvous::HttpServerOptions& options, const std::string& file,
    const std::string& source, rendezvous::HttpHandler handler, std::string* served) {
  auto security = LoadWeb(file, source);
  if (!security.ok()) return security.status();
  rendezvous::HttpServerOptions o = options;
  o.on_refusal = rendezvous::MakeRefusalLog("ddprun: ");
  auto server = rendezvous::StartMonitoringServer(o, *security, std::move(handler));
  if (server.ok() && served != nullptr) *served = rendezvous::DescribeWebSecurity(*security);
  return server;
}

const GrpcModule kLinked = [] {
  GrpcModule m;
  m.make_session = &MakeGrpcRendezvousSession;
  m.serve_table = &ServeTable;
  m.check_client_tls = [](const rendezvous::TlsOptions& options) {
    return rendezvous::LoadClientTls(options).status();
  };
  m.check_web_config = [](const std::string& file, const std::string& source) {
    return LoadWeb(file, source).status();
  };
  m.start_monitoring_server = &StartMonitoring;
  return m;  // run_status_command: the launcher's, added by the module's entry
}();

}  // namespace
}  // namespace ddprun::agent

extern "C" const ddprun::agent::GrpcModule* ddprun_grpc_module_linked() {
  return &ddprun::agent::kLinked;
}
