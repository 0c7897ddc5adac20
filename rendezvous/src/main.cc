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
#include "ddprun/rendezvous/server.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitCannotListen = 1;
constexpr int kExitUsage = 2;

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
  app.footer(
      "Examples:\n"
      "  ddprund                      # listen on 0.0.0.0:29400\n"
      "  ddprund --port 0             # the OS picks a free port; read it from the first line\n"
      "  ddprund --host 10.0.0.1 --port 29401\n"
      "then on each node:\n"
      "  ddprun --nnodes=2 --nproc_per_node=4 --rdzv_endpoint=HOST:29400 --rdzv_id=job1 "
      "train.py\n");
  app.set_help_flag("-h,--help", "Print this help and exit");
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");
  app.add_option("--host", options.host, "Address to listen on (0.0.0.0: every IPv4 interface)")
      ->option_text("ADDR [0.0.0.0]");
  app.add_option("--port", options.port, "Port to listen on; 0 lets the OS pick one")
      ->check(CLI::Range(0, 65535))
      ->option_text("PORT [29400]");
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help() << std::flush;
    return kExitOk;
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
    return kExitOk;
  }
  options.lease_timeout = ddprun::rendezvous::Seconds(lease_s);
  options.reattach_timeout = ddprun::rendezvous::Seconds(reattach_s);

  // gRPC's own error lines (a multi-line dump for a port in use) would drown
  // our one-line messages; GRPC_VERBOSITY=ERROR or DEBUG brings them back.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  auto server = ddprun::rendezvous::RendezvousServer::Start(options);
  if (!server.ok()) {
    // The server's message says why ("cannot listen on HOST:PORT: address
    // already in use; ..."); keep its first clause and give our own fix.
    std::string why(server.status().message());
    if (why.rfind("cannot listen", 0) != 0) {
      std::cerr << "ddprund: " << why << std::endl;  // e.g. a corrupt --state_dir
      return kExitCannotListen;
    }
    why = why.substr(0, why.find(';'));
    std::cerr << "ddprund: " << why << "; pick another --port or stop the other daemon"
              << std::endl;
    return kExitCannotListen;
  }
  std::cout << "ddprund listening on " << options.host << ":" << (*server)->port() << std::endl;

  int sig = 0;
  sigwait(&signals, &sig);
  std::cerr << "ddprund: received " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down"
            << std::endl;
  (*server)->Shutdown();
  return kExitOk;
}
