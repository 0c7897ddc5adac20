// What the agents' gRPC keepalive costs a ddprund replica (docs/ha.md,
// "Choosing the lease TTL"; docs/benchmarks.md). N client connections, each
// its own TCP connection holding one open Join stream (a round that never
// fills), as N agents of a running job have, to a real ddprund. gRPC pings
// only connections with an open call: an idle channel (a worker's store
// between calls) costs nothing. For
// `--seconds` each, three settings in the same run: no keepalive (the peer),
// a ping after 1000 ms (+ 1000 ms for its answer: what ddprun's agents and
// workers ask, rendezvous/src/client.cc, with 500 ms or 1000 ms for the
// answer), and a ping after 500 ms, which shows gRPC's floor: 1.51 sends at
// most one ping per second on a connection, so 500 ms costs what 1000 ms does.
// Prints ddprund's CPU time per second of each (from /proc/PID/stat), the
// pings per second, the CPU per ping above the peer, and this process's
// (the N clients') CPU the same way, and the TCP segments per second, which
// are exact (pings and acks) when the run has a network namespace of its own:
//
//   unshare -n sh -c 'ip link set lo up && build/bin/keepalive_cost 2000'
//   build/bin/keepalive_cost [N=2000] [--seconds 10] [--ddprund build/bin/ddprund]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/v1/ddprun.grpc.pb.h"

extern char** environ;

namespace {

// utime + stime of a process, in seconds.
double ProcessCpu(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const std::size_t rp = line.rfind(')');
  std::istringstream rest(line.substr(rp + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// TCP segments in + out so far in this network namespace (/proc/net/snmp).
// Exact for this run when it has a namespace of its own (unshare -n).
double TcpSegments() {
  std::ifstream f("/proc/net/snmp");
  std::string header, values;
  while (std::getline(f, header) && std::getline(f, values)) {
    if (header.rfind("Tcp:", 0) != 0) continue;
    std::istringstream h(header), v(values);
    std::string name, value;
    double total = 0;
    while (h >> name && v >> value)
      if (name == "InSegs" || name == "OutSegs") total += std::stod(value);
    return total;
  }
  return 0;
}

double SelfCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target, int keepalive_ms) {
  grpc::ChannelArguments args;
  // As rendezvous/src/client.cc's MakeChannel; keepalive_ms 0: none.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms > 0 ? keepalive_ms : INT_MAX);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms > 0 ? keepalive_ms : 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2000;
  double seconds = 10;
  std::string ddprund = "build/bin/ddprund";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--ddprund" && i + 1 < argc) {
      ddprund = argv[++i];
    } else if (a.find_first_not_of("0123456789") == std::string::npos) {
      n = std::atoi(a.c_str());
    } else {
      std::fprintf(stderr, "usage: keepalive_cost [N] [--seconds S] [--ddprund PATH]\n");
      return 2;
    }
  }
  const int port = FreePort();
  if (port == 0) {
    std::fprintf(stderr, "keepalive_cost: no free port on 127.0.0.1\n");
    return 1;
  }
  const std::string port_s = std::to_string(port);
  std::vector<std::string> args{ddprund, "--host",           "127.0.0.1", "--port",
                                port_s,  "--dashboard_port", "off"};
  std::vector<char*> cargv;
  for (auto& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, ddprund.c_str(), nullptr, nullptr, cargv.data(), environ) != 0) {
    std::fprintf(stderr, "keepalive_cost: cannot start %s; build it or give --ddprund\n",
                 ddprund.c_str());
    return 1;
  }
  const std::string target = "127.0.0.1:" + port_s;
  {
    auto probe = Channel(target, 0);
    if (!probe->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      std::fprintf(stderr, "keepalive_cost: ddprund did not listen on %s within 10 s\n",
                   target.c_str());
      kill(pid, SIGKILL);
      return 1;
    }
  }
  std::printf("%d connections with an open Join stream to one ddprund, %.0f s per setting\n", n,
              seconds);
  std::printf("%-20s %13s %9s %15s %13s %15s %11s\n", "keepalive", "ddprund CPU/s", "pings/s",
              "ddprund us/ping", "clients CPU/s", "clients us/ping", "TCP segs/s");
  double base_server = 0, base_client = 0;
  for (int ka : {0, 1000, 500}) {
    std::vector<std::shared_ptr<grpc::Channel>> chans;
    std::vector<std::unique_ptr<ddprun::v1::Rendezvous::Stub>> stubs;
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::unique_ptr<grpc::ClientAsyncReader<ddprun::v1::RoundEvent>>> calls;
    grpc::CompletionQueue cq;
    for (int i = 0; i < n; ++i) {
      chans.push_back(Channel(target, ka));
      stubs.push_back(ddprun::v1::Rendezvous::NewStub(chans.back()));
      ddprun::v1::JoinRequest req;
      req.set_protocol_version(1);
      req.set_job_id("keepalive-" + std::to_string(ka));
      req.set_host("127.0.0.1");
      req.set_pid(100000 + i);
      req.set_requested_rank(-1);
      req.set_nproc(1);
      req.set_min_nodes(n + 1);  // never fills: every stream stays open
      req.set_max_nodes(n + 1);
      req.mutable_policy()->set_last_call_timeout_s(10);
      req.mutable_policy()->set_join_timeout_s(600);
      req.set_master_port(1);
      req.set_command("keepalive_cost");
      req.set_resume_round(-1);
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      calls.push_back(stubs.back()->AsyncJoin(ctxs.back().get(), req, &cq, nullptr));
    }
    // The async API reads a connection (and a ping's ack) only while some
    // thread polls its completion queue: as an agent's reader thread does.
    std::thread poller([&cq] {
      void* tag = nullptr;
      bool ok = false;
      while (cq.Next(&tag, &ok)) {
      }
    });
    for (auto& c : chans) {
      if (!c->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
        std::fprintf(stderr, "keepalive_cost: a connection did not open within 10 s\n");
        kill(pid, SIGKILL);
        std::_Exit(1);
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(3));  // settle
    const double s0 = ProcessCpu(pid), c0 = SelfCpu(), g0 = TcpSegments();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double server = (ProcessCpu(pid) - s0) / wall, client = (SelfCpu() - c0) / wall;
    const double segs = (TcpSegments() - g0) / wall;
    const double pings = ka > 0 ? n * 1000.0 / ka : 0;
    if (ka == 0) {
      base_server = server;
      base_client = client;
      std::printf("%-20s %13.4f %9s %15s %13.4f %15s %11.0f\n", "none (peer)", server, "0", "-",
                  client, "-", segs);
    } else {
      std::printf("%-20s %13.4f %9.0f %15.2f %13.4f %15.2f %11.0f\n",
                  (std::to_string(ka) + " ms + " + std::to_string(ka) + " ms").c_str(), server,
                  pings, (server - base_server) / pings * 1e6, client,
                  (client - base_client) / pings * 1e6, segs);
    }
    std::fflush(stdout);
    for (auto& c : ctxs) c->TryCancel();
    cq.Shutdown();
    poller.join();
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  return 0;
}
