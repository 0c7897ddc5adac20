// Rendezvous time for N agents (N = 8 .. 4096), simulated in one process.
//
// For each N: a real RendezvousServer on 127.0.0.1:0, N Join streams over
// real gRPC connections (spread over a few channels, as N hosts would be),
// and the time from the first Join to the moment every agent holds its
// Assignment. Also the pure state machine (no transport) for reference.
//
// Usage: rendezvous_bench [max_n]   (prints a Markdown table)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/server.h"

using namespace ddprun::rendezvous;
using Clock_ = std::chrono::steady_clock;

namespace {

JoinSpec Spec(const std::string& job, int i, int n) {
  JoinSpec s;
  s.job_id = job;
  s.host = "10." + std::to_string(i / 65536) + "." + std::to_string((i / 256) % 256) + "." +
           std::to_string(i % 256);
  s.pid = 1000 + i;
  s.nproc = 8;
  s.min_nodes = n;
  s.max_nodes = n;
  s.join_timeout_s = 120;
  s.command = "train";
  return s;
}

double StateMachineMs(int n) {
  const SystemClock& clock = static_cast<const SystemClock&>(SystemClock::Get());
  JobRendezvous job("bench", clock);
  std::vector<Delivery> out;
  out.reserve(n);
  auto t0 = Clock_::now();
  for (int i = 0; i < n; ++i) (void)job.Join(Spec("bench", i, n), &out);
  auto dt = std::chrono::duration<double, std::milli>(Clock_::now() - t0).count();
  if (static_cast<int>(out.size()) != n) {
    std::fprintf(stderr, "state machine delivered %zu of %d assignments\n", out.size(), n);
    std::exit(1);
  }
  return dt;
}

double GrpcMs(int n, int port, int round) {
  const int kChannels = std::min(n, 64);
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int c = 0; c < kChannels; ++c) {
    clients.push_back(RendezvousClient::Create("127.0.0.1", port));
    if (!clients.back()->WaitForConnected(std::chrono::seconds(10)).ok()) std::exit(1);
  }
  const std::string job = "bench-" + std::to_string(n) + "-" + std::to_string(round);
  std::vector<std::unique_ptr<JoinStream>> streams(n);
  auto t0 = Clock_::now();
  for (int i = 0; i < n; ++i) streams[i] = clients[i % kChannels]->Join(Spec(job, i, n));
  int got = 0;
  for (int i = 0; i < n; ++i) {
    RoundEvent e = streams[i]->Next(std::chrono::seconds(120));
    if (std::holds_alternative<Assignment>(e)) ++got;
  }
  auto dt = std::chrono::duration<double, std::milli>(Clock_::now() - t0).count();
  if (got != n) {
    std::fprintf(stderr, "only %d of %d agents got an assignment\n", got, n);
    std::exit(1);
  }
  streams.clear();
  return dt;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int max_n = argc > 1 ? std::atoi(argv[1]) : 4096;
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto server = RendezvousServer::Start(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("| agents | state machine only (ms) | gRPC, N streams on loopback (ms) |\n");
  std::printf("|---|---|---|\n");
  for (int n = 8; n <= max_n; n *= 2) {
    std::vector<double> sm, rpc;
    const int reps = n >= 1024 ? 3 : 5;
    for (int r = 0; r < reps; ++r) {
      sm.push_back(StateMachineMs(n));
      rpc.push_back(GrpcMs(n, (*server)->port(), r));
    }
    std::printf("| %d | %.2f | %.1f |\n", n, Median(sm), Median(rpc));
    std::fflush(stdout);
  }
  return 0;
}
