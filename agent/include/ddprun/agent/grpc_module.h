// The gRPC half of ddprun, in a module of its own (lib/libddprun_grpc.so next
// to bin/ddprun) that is loaded with dlopen on first need. Loading gRPC,
// protobuf and their abseil dependencies costs about 35 ms of relocations
// and static constructors per process (docs/launch.md), which a single-node
// job does not pay unless a client (an SDK worker's store, `ddprun status`)
// reaches its rendezvous. Multi-node modes load it when the session opens.
//
// The table below is a C++ interface between two parts of one build (same
// compiler, same sources), not a stable ABI: kGrpcModuleVersion changes when
// it does, and a module of another version is refused.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::agent {

inline constexpr int kGrpcModuleVersion = 4;
// The module's one exported symbol: `const GrpcModule* ddprun_grpc_module()`.
inline constexpr const char* kGrpcModuleEntry = "ddprun_grpc_module";

// A RendezvousServer over a table its caller owns, fed with connections the
// caller accepts (RendezvousServer::HandOver).
class ServedTable {
 public:
  virtual ~ServedTable() = default;
  // Takes the accepted fd and serves it.
  virtual void HandOver(int fd) = 0;
  // Ends every call with a deadline; the table's owner shuts the table down
  // first, so that streams and store waits end cleanly.
  virtual void Shutdown() = 0;
};

struct GrpcModule {
  // A launcher subcommand that is a gRPC client: args are main's argv.
  using CommandFn = int (*)(const std::vector<std::string>& args, std::ostream& out,
                            std::ostream& err);
  using Command = CommandFn GrpcModule::*;

  int version = kGrpcModuleVersion;
  // The gRPC RendezvousSession (grpc_rendezvous_session.cc), every mode.
  std::unique_ptr<RendezvousSession> (*make_session)(const AgentOptions& options,
                                                     const rendezvous::Clock& clock) = nullptr;
  // Serves `table` and its metrics hub `hub` (neither owned; the table
  // reports to the hub) on connections handed over; `port` is what the
  // listener the caller accepts on is bound to (for messages).
  absl::StatusOr<std::unique_ptr<ServedTable>> (*serve_table)(rendezvous::JobTable& table,
                                                              rendezvous::MetricsHub& hub,
                                                              int port) = nullptr;
  // rendezvous::LoadClientTls's checks of the PEM files (readable, PEM,
  // key matching the certificate, currently valid): OpenSSL lives here, so
  // that bin/ddprun neither loads libcrypto nor applies its relocations at
  // every start; only a job given TLS files calls it (it needs the module
  // for its gRPC channel anyway). Error: LoadClientTls's one line.
  absl::Status (*check_client_tls)(const rendezvous::TlsOptions& options) = nullptr;
  // --web_config (docs/security.md): reads and checks the file and the PEM
  // files it names (OpenSSL lives here). Error: one line naming `source`,
  // the file and the key.
  absl::Status (*check_web_config)(const std::string& file, const std::string& source) = nullptr;
  // The monitoring port with that web configuration applied (HTTPS, basic
  // auth); *served gets the line that says what it serves. Errors as
  // HttpServer::Start's, or check_web_config's.
  absl::StatusOr<std::unique_ptr<rendezvous::HttpServer>> (*start_monitoring_server)(
      const rendezvous::HttpServerOptions& options, const std::string& file,
      const std::string& source, rendezvous::HttpHandler handler, std::string* served) = nullptr;
  // `ddprun status ...` (launcher/client/src/status_command.cc).
  CommandFn run_status_command = nullptr;
  // `ddprun top ...` (launcher/client/src/top_command.cc).
  CommandFn run_top_command = nullptr;
};

// Loads the module once per process (thread-safe) from
// <dir of /proc/self/exe>/../lib/libddprun_grpc.so; a program that links
// ddprun_agent (the gRPC session linked in) gets that instead, without
// run_status_command and run_top_command. Error: one line naming
// the file, dlerror() and the fix (build the ddprun_grpc target).
absl::StatusOr<const GrpcModule*> LoadGrpcModule();

}  // namespace ddprun::agent
