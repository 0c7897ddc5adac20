// ddprund: the rendezvous daemon of multi-node jobs. Serves the Rendezvous
// and Store gRPC services until SIGINT or SIGTERM, then shuts down and exits 0.
//
// Contract with scripts and tests: once it accepts connections it prints
// exactly one line, "ddprund listening on HOST:PORT", to stdout and flushes it
// (with --port 0, PORT is the one the OS picked). Errors are one line on
// stderr: exit 2 for usage errors, 1 when it cannot listen.
#include <signal.h>
#include <stdlib.h>

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/exit_codes.h"
#include "ddprun/rendezvous/host_port.h"
#include "ddprun/rendezvous/server.h"
#include "ddprun/rendezvous/tls.h"
#include "yaml-cpp/yaml.h"

namespace {

using ddprun::kExitSuccess;
using ddprun::kExitUsage;
using ddprun::rendezvous::kDefaultRdzvPort;
using ddprun::rendezvous::kMaxPort;
// ddprund's own: it cannot serve (the port is taken, --state_dir is unusable).
constexpr int kExitCannotServe = 1;

// --config FILE: `host:` and `port:` (configs/ddprund.yaml); flags win.
// Returns "" or a one-line error "FILE:LINE:COL: key: problem; fix".
std::string LoadConfig(const std::string& path, bool host_given, bool port_given,
                       ddprun::rendezvous::ServerOptions& options) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return path + ": cannot read the config file; check the --config path";
  } catch (const YAML::Exception& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
           ": (syntax): " + e.msg + "; fix the YAML syntax";
  }
  auto where = [&](const YAML::Node& n) {
    return path + ":" + std::to_string(n.Mark().line + 1) + ":" +
           std::to_string(n.Mark().column + 1);
  };
  if (!root.IsMap()) return path + ":1:1: (top level): must be a mapping; write host: and port:";
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (key != "host" && key != "port") {
      return where(kv.first) + ": " + key + ": unknown key; ddprund knows host and port";
    }
    if (!kv.second.IsScalar()) return where(kv.second) + ": " + key + ": must be a single value";
  }
  if (root["host"] && !host_given) options.host = root["host"].Scalar();
  if (root["port"] && !port_given) {
    const std::string text = root["port"].Scalar();
    char* end = nullptr;
    const long port = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || port < 0 || port > kMaxPort) {
      return where(root["port"]) + ": port: must be 0.." + std::to_string(kMaxPort) + ", got '" +
             text + "'; write a port";
    }
    options.port = static_cast<int>(port);
  }
  return "";
}

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.1.0"
#endif

}  // namespace

int main(int argc, char** argv) {
  // Block the shutdown signals before any gRPC thread exists, so that every
  // thread inherits the mask and only sigwait() below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ddprun::rendezvous::ServerOptions options;
  CLI::App app{
      "ddprund: the rendezvous daemon for multi-node ddprun jobs. Start one per cluster (any\n"
      "host the nodes can reach), then give every node's ddprun --rdzv_endpoint=HOST:PORT.\n"
      "One daemon serves any number of jobs, told apart by --rdzv_id. Stop it with SIGINT or\n"
      "SIGTERM.",
      "ddprund"};
  const std::string port = std::to_string(kDefaultRdzvPort);
  // clang-format off
  app.footer(absl::StrCat(
      "Examples:\n",
      "  ddprund                      # listen on 0.0.0.0:", port, "\n",
      "  ddprund --port 0             # the OS picks a free port; read it from the first line\n",
      "  ddprund --host 10.0.0.1 --port ", kDefaultRdzvPort + 1, "\n",
      "then on each node:\n",
      "  ddprun --nnodes=2 --nproc_per_node=4 --rdzv_endpoint=HOST:", port,
      " --rdzv_id=job1 train.py\n"));
  // clang-format on
  app.set_help_flag("-h,--help", "Print this help and exit");
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");
  app.add_option("--host", options.host, "Address to listen on (0.0.0.0: every IPv4 interface)")
      ->option_text("ADDR [0.0.0.0]");
  CLI::Option* port_opt =
      app.add_option("--port", options.port, "Port to listen on; 0 lets the OS pick one")
          ->check(CLI::Range(0, kMaxPort))
          ->option_text("PORT [" + port + "]");
  std::string config;
  app.add_option("--config", config,
                 "YAML file with host: and port: (configs/ddprund.yaml); flags override it")
      ->option_text("FILE");
  app.add_option("--state_dir,--state-dir", options.state_dir,
                 "Persist jobs and their stores here (fsync), so that a restarted ddprund\n"
                 "resumes them; running jobs keep running across a restart")
      ->option_text("DIR [none: in memory]");
  double lease_s = std::chrono::duration<double>(options.lease_timeout).count();
  app.add_option("--lease_timeout,--lease-timeout", lease_s,
                 "An agent whose connection stays silent this long (cut network) is lost\n"
                 "and its job re-forms without it")
      ->check(CLI::Range(0.2, 3600.0))
      ->option_text("SECONDS [4]");
  double reattach_s = std::chrono::duration<double>(options.reattach_timeout).count();
  app.add_option("--reattach_timeout,--reattach-timeout", reattach_s,
                 "After a restart with --state_dir, how long a running job's agents have\n"
                 "to reconnect before they count as lost")
      ->check(CLI::Range(0.1, 3600.0))
      ->option_text("SECONDS [10]");
  app.add_option("--quarantine_failures,--quarantine-failures", options.quarantine.failures,
                 "A host whose workers fail this many times in one job is refused for the\n"
                 "cooldown, so the job re-forms without it (0: never)")
      ->check(CLI::Range(0, 1000000))
      ->option_text("N [3]");
  double cooldown_s = std::chrono::duration<double>(options.quarantine.cooldown).count();
  app.add_option("--quarantine_cooldown,--quarantine-cooldown", cooldown_s,
                 "How long a quarantined host is refused; `ddprun status` shows why")
      ->check(CLI::Range(0.0, 1e7))
      ->option_text("SECONDS [300]");
  ddprun::rendezvous::TlsOptions tls;
  app.add_option("--tls_cert,--tls-cert", tls.cert_file,
                 "PEM certificate (chain) of this daemon: serve TLS instead of plaintext;\n"
                 "its subjectAltName must hold the name or address agents connect to")
      ->option_text("FILE [none: plaintext]");
  app.add_option("--tls_key,--tls-key", tls.key_file, "PEM private key of --tls_cert")
      ->option_text("FILE");
  app.add_option("--tls_client_ca,--tls-client-ca", tls.client_ca_file,
                 "Mutual TLS: require every agent, worker and `ddprun status` to present a\n"
                 "certificate signed by this PEM CA (docs/tls.md)")
      ->option_text("FILE [none: no client certificates]");
  std::string dashboard = std::to_string(ddprun::rendezvous::kDefaultDashboardPort);
  app.add_option("--dashboard_port,--dashboard-port", dashboard,
                 "Monitoring HTTP port: the dashboard, /api/v1/jobs and Prometheus /metrics "
                 "for every job (docs/monitoring.md); 0 lets the OS pick one, off disables it")
      ->option_text("PORT|off [" + dashboard + "]");
  std::string etcd_endpoints;
  app.add_option("--etcd_endpoints,--etcd-endpoints", etcd_endpoints,
                 "Run as one replica of a replicated control plane over this etcd v3\n"
                 "cluster (comma-separated members): replicas elect one leader, which\n"
                 "serves every job and keeps it in etcd (docs/ha.md)")
      ->option_text("H:P,H:P,... [none: one daemon]");
  app.add_option("--etcd_prefix,--etcd-prefix", options.etcd_prefix,
                 "etcd key prefix of this ddprund cluster; two clusters sharing one etcd\n"
                 "need two prefixes")
      ->option_text("PREFIX [/ddprun]");
  app.add_option("--etcd_lease_ttl,--etcd-lease-ttl", options.etcd_lease_ttl_s,
                 "A killed leader replica is replaced within this many seconds (etcd\n"
                 "raises values below its own minimum)")
      ->check(CLI::Range(1, 3600))
      ->option_text("SECONDS [2]");
  app.add_option("--advertise_addr,--advertise-addr", options.advertise,
                 "How agents reach this replica; standbys name the leader by it")
      ->option_text("HOST:PORT [host:port, hostname for 0.0.0.0]");
  app.add_option("--etcd_ca,--etcd-ca", options.etcd_tls.ca_file,
                 "CA certificate (PEM) that verifies etcd's members: TLS to etcd")
      ->option_text("FILE");
  app.add_option("--etcd_cert,--etcd-cert", options.etcd_tls.cert_file,
                 "Client certificate (PEM) for an etcd with --client-cert-auth")
      ->option_text("FILE");
  app.add_option("--etcd_key,--etcd-key", options.etcd_tls.key_file,
                 "The key of --etcd_cert (PEM)")
      ->option_text("FILE");
  options.etcd_tls.names.ca = "--etcd_ca";
  options.etcd_tls.names.cert = "--etcd_cert";
  options.etcd_tls.names.key = "--etcd_key";
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help() << std::flush;
    return kExitSuccess;
  } catch (const CLI::ExtrasError& e) {
    std::cerr << "ddprund: unexpected argument(s): " << CLI::detail::join(app.remaining(), " ")
              << "; see ddprund --help" << std::endl;
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprund: " << e.what() << "; see ddprund --help" << std::endl;
    return kExitUsage;
  }
  if (version) {
    std::cout << "ddprund " << DDPRUN_VERSION << std::endl;
    return kExitSuccess;
  }
  if (!config.empty()) {
    const std::string error =
        LoadConfig(config, app.count("--host") > 0, port_opt->count() > 0, options);
    if (!error.empty()) {
      std::cerr << "ddprund: " << error << std::endl;
      return kExitUsage;
    }
  }
  // Checked before anything listens: a bad file is one line naming the flag.
  if (auto loaded = ddprun::rendezvous::LoadServerTls(tls); loaded.ok()) {
    options.tls = *std::move(loaded);
  } else {
    std::cerr << "ddprund: " << loaded.status().message() << std::endl;
    return kExitUsage;
  }
  if (app.count("--etcd_endpoints") > 0) {
    auto list = ddprun::rendezvous::ParseHostPortList(etcd_endpoints, {.default_port = 2379});
    if (!list.ok()) {
      std::cerr << "ddprund: --etcd_endpoints=" << etcd_endpoints << ": " << list.status().message()
                << "; write the etcd members as HOST:PORT,HOST:PORT" << std::endl;
      return kExitUsage;
    }
    options.etcd_endpoints = *std::move(list);
  }
  options.lease_timeout = ddprun::rendezvous::Seconds(lease_s);
  options.reattach_timeout = ddprun::rendezvous::Seconds(reattach_s);
  options.quarantine.cooldown = ddprun::rendezvous::Seconds(cooldown_s);
  options.listen_fix = "pick another --port or stop the other daemon";
  if (auto d = ddprun::rendezvous::ParseDashboardPort(dashboard); d.ok()) {
    options.dashboard_port = *d;
  } else {
    std::cerr << "ddprund: --dashboard_port: " << d.status().message() << std::endl;
    return kExitUsage;
  }
  options.dashboard_listen_fix = "pick another --dashboard_port, or --dashboard_port=off";
  options.log_hangs = true;

  // gRPC's own error lines (a multi-line dump for a port in use) would drown
  // our one-line messages; GRPC_VERBOSITY=ERROR or DEBUG brings them back.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  auto server = ddprun::rendezvous::RendezvousServer::Start(options);
  if (!server.ok()) {
    // One line that says why and what to do: "cannot listen on HOST:PORT:
    // address already in use; <listen_fix>", or the --state_dir's problem.
    std::cerr << "ddprund: " << server.status().message() << std::endl;
    return kExitCannotServe;
  }
  // The ready line stays as it is (scripts parse it); the mode goes to stderr.
  if (options.tls.enabled) {
    std::cerr << "ddprund: serving TLS"
              << (options.tls.client_ca_pem.empty()
                      ? " (no client certificates)"
                      : " with mutual TLS (clients need a certificate signed by --tls_client_ca)")
              << std::endl;
  }
  std::cout << "ddprund listening on "
            << ddprun::rendezvous::FormatHostPort(options.host, (*server)->port()) << std::endl;
  if ((*server)->dashboard_port() >= 0) {
    // stderr: stdout's one ready line is a contract for scripts.
    std::cerr << "ddprund dashboard at http://"
              << ddprun::rendezvous::FormatHostPort(
                     options.host == "0.0.0.0" ? "127.0.0.1" : options.host,
                     (*server)->dashboard_port())
              << "/ (Prometheus: /metrics)" << std::endl;
  }

  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "ddprund: received " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down"
            << std::endl;
  (*server)->Shutdown();
  return kExitSuccess;
}
