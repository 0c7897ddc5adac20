// ddprund: the rendezvous daemon of multi-node jobs. Serves the Rendezvous
// and Store gRPC services until SIGINT or SIGTERM, then shuts down and exits 0.
//
// Contract with scripts and tests: once it accepts connections it prints
// exactly one line, "ddprund listening on HOST:PORT", to stdout and flushes it
// (with --port 0, PORT is the one the OS picked). Errors are one line on
// stderr: exit 2 for usage errors, 1 when it cannot listen.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/suggest.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/daemon/daemon_knobs.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/daemon/server_heap.h"
#include "ddprun/rendezvous/monitoring/web_config.h"
#include "ddprun/rendezvous/monitoring/web_server.h"

namespace {

using ddprun::kExitSuccess;
using ddprun::kExitUsage;
using ddprun::rendezvous::DaemonEnvName;
using ddprun::rendezvous::kDefaultRdzvPort;
// ddprund's own: it cannot serve (the port is taken, --state_dir is unusable).
constexpr int kExitCannotServe = 1;

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
  std::string config;
  app.add_option("--config", config,
                 "YAML file of these settings, keyed by their names (configs/ddprund.yaml);\n"
                 "DDPRUND_<NAME> variables override it, flags override both")
      ->option_text("FILE");
  // Every setting from the one table (daemon_knobs.h): --name and --na-me.
  std::map<std::string, std::string> texts;
  std::vector<std::pair<std::string, CLI::Option*>> given;
  for (const ddprun::rendezvous::DaemonKnob& k : ddprun::rendezvous::DaemonKnobs()) {
    std::string dashed = k.name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    const std::string names =
        dashed == k.name ? absl::StrCat("--", k.name) : absl::StrCat("--", k.name, ",--", dashed);
    CLI::Option* opt =
        app.add_option(names, texts[k.name], absl::StrCat(k.help, " [", DaemonEnvName(k.name), "]"))
            ->option_text(absl::StrCat(k.metavar, " [", k.default_text, "]"));
    given.emplace_back(k.name, opt);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help() << std::flush;
    return kExitSuccess;
  } catch (const CLI::ExtrasError& e) {
    // An option of no one's: name the closest of ddprund's.
    std::vector<std::string> known;
    for (const CLI::Option* opt : app.get_options()) {
      for (const std::string& l : opt->get_lnames()) known.push_back("--" + l);
    }
    for (const std::string& a : app.remaining()) {
      if (a.rfind("--", 0) != 0) continue;
      const std::string name = a.substr(0, a.find('='));
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      std::cerr << "ddprund: unknown option '" << name << "'"
                << ddprun::rendezvous::DidYouMean(name, known) << "; see ddprund --help"
                << std::endl;
      return kExitUsage;
    }
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
  // flag > DDPRUND_<NAME> > --config file > default, each value checked by
  // its knob's parser: a bad one is one line naming where it came from.
  std::map<std::string, std::string> flags;
  for (const auto& [name, opt] : given) {
    if (opt->count() > 0) flags[name] = texts[name];
  }
  std::optional<ddprun::rendezvous::DaemonConfigFile> file;
  if (!config.empty()) {
    auto read = ddprun::rendezvous::ReadDaemonConfig(config);
    if (!read.ok()) {
      std::cerr << "ddprund: " << read.status().message() << std::endl;
      return kExitUsage;
    }
    file = *std::move(read);
  }
  ddprun::rendezvous::DaemonSettings settings;
  if (absl::Status st = ddprun::rendezvous::ResolveDaemonSettings(
          flags, [](const char* name) { return std::getenv(name); }, file ? &*file : nullptr,
          settings);
      !st.ok()) {
    std::cerr << "ddprund: " << st.message() << std::endl;
    return kExitUsage;
  }
  ddprun::rendezvous::ServerOptions& options = settings.server;
  // Settings that exclude each other are a usage mistake (exit 2), found
  // before anything opens (the server checks the same, for its other callers).
  if (!options.state_dir.empty() && !options.etcd_endpoints.empty()) {
    std::cerr << "ddprund: --state_dir and --etcd_endpoints exclude each other: replicas keep "
                 "their state in etcd; drop --state_dir"
              << std::endl;
    return kExitUsage;
  }
  // Checked before anything listens: a bad file is one line naming the flag.
  if (auto loaded = ddprun::rendezvous::LoadServerTls(settings.tls); loaded.ok()) {
    options.tls = *std::move(loaded);
  } else {
    std::cerr << "ddprund: " << loaded.status().message() << std::endl;
    return kExitUsage;
  }
  // The monitoring port: --web_config, else the gRPC port's certificate
  // (docs/security.md). Checked before anything listens, as the TLS files.
  std::string web_line;
  if (settings.web_config == ddprun::rendezvous::kWebConfigPlaintext) {
    if (options.tls.enabled && options.dashboard_port >= 0) {
      web_line =
          "ddprund: warning: the monitoring port serves plain HTTP to anyone who can reach it, "
          "next to a TLS gRPC port (" +
          settings.web_config_source +
          "=plaintext); give a web configuration file to protect job states and hang stacks";
    }
  } else if (!settings.web_config.empty()) {
    auto config =
        ddprun::rendezvous::ReadWebConfig(settings.web_config, settings.web_config_source);
    auto security = config.ok() ? ddprun::rendezvous::LoadWebSecurity(*config, settings.web_config,
                                                                      settings.web_config_source)
                                : config.status();
    if (!security.ok()) {
      std::cerr << "ddprund: " << security.status().message() << std::endl;
      return kExitUsage;
    }
    options.dashboard_security = *std::move(security);
    if (!options.dashboard_security.tls.enabled && !options.dashboard_security.users.empty()) {
      web_line =
          "ddprund: warning: basic auth over plain HTTP sends passwords in the clear; add "
          "tls_server_config to " +
          settings.web_config;
    }
  } else if (options.tls.enabled) {
    options.dashboard_security = ddprun::rendezvous::WebSecurityFromGrpcTls(options.tls);
  }
  options.listen_fix = "pick another --port or stop the other daemon";
  options.dashboard_listen_fix = "pick another --dashboard_port, or --dashboard_port=off";
  options.log_hangs = true;

  // Settings are valid: serve from a heap of huge pages (server_heap.h). This
  // may re-execute ddprund once (same pid, same arguments); nothing has been
  // printed or started yet.
  ddprun::rendezvous::ExecWithServerHeap(argv);
  // gRPC's own error lines (a multi-line dump for a port in use) would drown
  // our one-line messages; GRPC_VERBOSITY=ERROR or DEBUG brings them back.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  ddprun::rendezvous::KeepFreedHeapForReuse();
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
    if (!web_line.empty()) std::cerr << web_line << std::endl;
    if (options.dashboard_security.tls.enabled || !options.dashboard_security.users.empty()) {
      std::cerr << "ddprund: the monitoring port serves "
                << ddprun::rendezvous::DescribeWebSecurity(options.dashboard_security) << std::endl;
    }
    std::cerr << "ddprund dashboard at "
              << (options.dashboard_security.tls.enabled ? "https://" : "http://")
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
