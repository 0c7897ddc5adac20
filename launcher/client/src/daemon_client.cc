#include "daemon_client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/common/suggest.h"

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
    // An option of no one's: name the closest of this command's.
    std::vector<std::string> known;
    for (const CLI::Option* opt : app.get_options()) {
      for (const std::string& l : opt->get_lnames()) known.push_back("--" + l);
    }
    for (auto a = args.begin() + std::min<std::size_t>(2, args.size()); a != args.end(); ++a) {
      if (*a == "--") break;
      if (!absl::StartsWith(*a, "--")) continue;
      const std::string name = a->substr(0, a->find('='));
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      err << "ddprun " << command << ": unknown option '" << name << "'"
          << rendezvous::DidYouMean(name, known) << "; see ddprun " << command << " --help"
          << std::endl;
      return kExitUsage;
    }
    err << "ddprun " << command << ": " << e.what() << "; see ddprun " << command << " --help"
        << std::endl;
    return kExitUsage;
  }
  return std::nullopt;
}

namespace {

// One TCP connection to `hp` before the timeout: OK when any address of it
// accepts (or the connect does not finish in time: gRPC's wait decides then);
// Unavailable naming the OS's reason when the name does not resolve or every
// address refuses.
absl::Status ProbeListening(const rendezvous::HostPort& hp, rendezvous::Duration timeout) {
  const std::string where = rendezvous::FormatHostPort(hp);
  auto addrs = rendezvous::net::ResolveTcp(hp.host, hp.port);
  if (!addrs.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot resolve the rendezvous host '", hp.host,
                                               "' (", addrs.status().message(),
                                               "); check --rdzv_endpoint"));
  }
  const rendezvous::TimePoint deadline = rendezvous::SystemClock::Get().Now() + timeout;
  std::string reason;
  for (const rendezvous::net::SocketAddress& a : *addrs) {
    auto fd = rendezvous::net::ConnectTcp(a, deadline);
    if (fd.ok() || absl::IsDeadlineExceeded(fd.status())) return absl::OkStatus();
    reason = std::string(fd.status().message());
  }
  return absl::UnavailableError(absl::StrCat("cannot reach the rendezvous at ", where, " (", reason,
                                             "); check that ddprund (or the node hosting the "
                                             "rendezvous) runs there and the port is right"));
}

}  // namespace

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
  // A port where nothing listens is refused at once: say so instead of
  // waiting the whole --timeout for gRPC's channel.
  if (absl::Status st = ProbeListening(*hp, c.timeout); !st.ok()) return st;
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
