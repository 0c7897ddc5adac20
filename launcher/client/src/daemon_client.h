// What every client subcommand of a running rendezvous (`ddprun status`,
// `ddprun top`) shares: the flags that say where it is and how to talk to it
// (--rdzv_endpoint, --tls_ca/--tls_cert/--tls_key with their PET_ variables,
// --timeout), and the connection made from them. One place, so that every
// client speaks TLS the same way and says the same thing when it cannot.
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"

namespace ddprun::launcher {

struct DaemonClientFlags {
  std::string endpoint;  // HOST[:PORT]; "" = PET_RDZV_ENDPOINT
  rendezvous::TlsOptions tls;
  double timeout_s = 5;
};

// Registers the shared flags on `app`; `endpoint_help` says what is asked.
void AddDaemonClientFlags(CLI::App& app, DaemonClientFlags& flags,
                          const std::string& endpoint_help);

// Parses `args` (argv of `ddprun <command> ...`) into `app`. Returns the exit
// code when the command is done (--help printed: 0; a parse error printed in
// one line naming `command`: kExitUsage), nullopt to go on.
std::optional<int> ParseClientCommand(CLI::App& app, const std::vector<std::string>& args,
                                      const std::string& command, std::ostream& out,
                                      std::ostream& err);

struct DaemonConnection {
  rendezvous::HostPort endpoint;
  rendezvous::Duration timeout{};
  std::unique_ptr<rendezvous::RendezvousClient> client;
};

// After parsing: PET_ fallbacks, the TLS files checked, the endpoint parsed,
// then connected within the timeout. Errors are one line without the command
// name: kind bad input (exit kExitUsage) for flags and files, otherwise the
// daemon could not be reached or refused the handshake (kExitRendezvousError).
absl::StatusOr<DaemonConnection> ConnectToDaemon(DaemonClientFlags flags);

// The exit code of ConnectToDaemon's error, decided on its kind.
int ExitCodeOf(const absl::Status& status);

}  // namespace ddprun::launcher
