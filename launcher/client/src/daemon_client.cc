#include "daemon_client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/exit_codes.h"

namespace ddprun::launcher {

void AddDaemonClientFlags(CLI::App& app, DaemonClientFlags& flags,
                          const std::string& endpoint_help) {
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", flags.endpoint,
                 absl::StrCat(endpoint_help, ", HOST[:PORT] (port ", rendezvous::kDefaultRdzvPort,
                              " by default; env PET_RDZV_ENDPOINT)"));
  // The agent's TLS knobs (knobs.h), with the same PET_ variables.
  app.add_option("--tls_ca,--tls-ca", flags.tls.ca_file,
                 "PEM CA that signed ddprund's certificate: talk TLS (env PET_TLS_CA)");
  app.add_option("--tls_cert,--tls-cert", flags.tls.cert_file,
                 "PEM client certificate for mutual TLS (env PET_TLS_CERT)");
  app.add_option("--tls_key,--tls-key", flags.tls.key_file,
                 "PEM key of --tls_cert (env PET_TLS_KEY)");
  app.add_option("--timeout", flags.timeout_s, "Seconds to wait for the daemon")
      ->check(CLI::Range(0.1, 3600.0));
}

std::optional<int> ParseClientCommand(CLI::App& app, const std::vector<std::string>& args,
                                      const std::string& command, std::ostream& out,
                                      std::ostream& err) {
  // CLI11 takes the arguments reversed, without "ddprun <command>".
  std::vector<std::string> rest(args.begin() + std::min<std::size_t>(2, args.size()), args.end());
  std::reverse(rest.begin(), rest.end());
  try {
    app.parse(rest);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitSuccess;
  } catch (const CLI::ParseError& e) {
    err << "ddprun " << command << ": " << e.what() << "; see ddprun " << command << " --help"
        << std::endl;
    return kExitUsage;
  }
  return std::nullopt;
}

absl::StatusOr<DaemonConnection> ConnectToDaemon(DaemonClientFlags flags) {
  if (flags.endpoint.empty()) {
    if (const char* e = std::getenv("PET_RDZV_ENDPOINT"); e != nullptr) flags.endpoint = e;
  }
  auto from_env = [](std::string& file, std::string& name, const char* flag) {
    const std::string pet = PetName(flag);
    if (!file.empty()) return;
    if (const char* e = std::getenv(pet.c_str()); e != nullptr && *e != '\0') {
      file = e;
      name = absl::StrCat(pet, " (--", flag, ")");
    }
  };
  from_env(flags.tls.ca_file, flags.tls.names.ca, "tls_ca");
  from_env(flags.tls.cert_file, flags.tls.names.cert, "tls_cert");
  from_env(flags.tls.key_file, flags.tls.names.key, "tls_key");
  auto tls = rendezvous::LoadClientTls(flags.tls);
  if (!tls.ok()) return absl::InvalidArgumentError(tls.status().message());
  if (flags.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv_endpoint is required; pass the daemon's HOST:PORT (ddprun prints it when it "
        "hosts the rendezvous)");
  }
  // The same parser, and so the same message, as ddprun's own flag.
  auto hp = ParseEndpoint(flags.endpoint, rendezvous::kDefaultRdzvPort);
  if (!hp.ok())
    return absl::InvalidArgumentError(absl::StrCat("--rdzv_endpoint ", hp.status().message()));
  DaemonConnection c;
  c.endpoint = *hp;
  c.timeout = std::chrono::duration_cast<rendezvous::Duration>(
      std::chrono::duration<double>(flags.timeout_s));
  c.client = rendezvous::RendezvousClient::Create(hp->host, hp->port, *tls);
  if (absl::Status st = c.client->WaitForConnected(c.timeout); !st.ok()) {
    if (rendezvous::IsTlsHandshakeError(st)) return st;
    return absl::UnavailableError(
        absl::StrCat("cannot reach the rendezvous at ", rendezvous::FormatHostPort(*hp), " within ",
                     flags.timeout_s, " s; check that ddprund runs there"));
  }
  return c;
}

int ExitCodeOf(const absl::Status& status) {
  return rendezvous::KindOf(status) == rendezvous::ErrorKind::kBadInput ? kExitUsage
                                                                        : kExitRendezvousError;
}

}  // namespace ddprun::launcher
