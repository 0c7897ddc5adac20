// `ddprun bench --scaling` across nodes (docs/bench.md "Across nodes"): two
// "nodes" on this machine (their own --local_addr), each a real ddprun with
// the real bench worker, through the static rendezvous and through ddprund.
// Rows 1, 2, 4 with --nproc_per_node=2: sizes 1 and 2 on node 0 alone, 4 on
// both. Every row's first step is checked by the workers (a wrong average
// exits 4), so exit 0 means the values were right; the figures are shape-
// checked only (bench/ measures them). A node that dies ends the run on the
// other at once.
#include <signal.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/exit_codes.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

bool BenchWorkerBuilt() { return std::filesystem::exists(Bin("ddprun-bench-worker")); }

std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string w; in >> w;) f.push_back(w);
  return f;
}

// The table's rows (lines that are not comments) of `out`.
std::vector<std::vector<std::string>> Rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : Lines(out))
    if (!line.empty() && line[0] != '#') rows.push_back(Fields(line));
  return rows;
}

// Starts node `i` of a 2 x 2 scaling run with the rendezvous flags.
Proc& StartNode(Harness& h, const std::string& tag, int i, const std::vector<std::string>& rdzv,
                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{
      "bench",      "--scaling",          "--compute_ms=20",
      "--iters=2",  "--warmup=0",         "--batch=16",
      "--nnodes=2", "--nproc_per_node=2", "--local_addr=127.0.0." + std::to_string(i + 1)};
  args.insert(args.end(), rdzv.begin(), rdzv.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return h.StartDdprun(tag + "_node" + std::to_string(i), args, {{"DDP_TIMEOUT_SEC", "60"}});
}

// Both nodes exit 0; node 0 prints rows 1, 2, 4, node 1 none; node 1 ran only
// its part of the 4-rank job, as ranks 2-3.
void CheckRun(Harness& h, Proc& n0, Proc& n1) {
  const int rc1 = h.Wait(n1, 120);
  const int rc0 = h.Wait(n0, 120);
  INFO("node 0 stdout:\n"
       << n0.Out() << "\nnode 0 stderr:\n"
       << n0.Err() << "\nnode 1 stderr:\n"
       << n1.Err());
  REQUIRE(rc0 == 0);
  REQUIRE(rc1 == 0);
  const auto rows = Rows(n0.Out());
  REQUIRE(rows.size() == 3);
  const int worlds[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(rows[i].size() == 7);
    CHECK(std::stoi(rows[i][0]) == worlds[i]);
    CHECK(std::stoi(rows[i][1]) == 16 * worlds[i]);         // global batch
    CHECK(std::stod(rows[i][2]) > 0);                       // samples/s
    CHECK(std::stod(rows[i][5]) >= 20 * 0.9);               // compute (ms) at least --compute_ms
    CHECK(std::stod(rows[i][4]) >= std::stod(rows[i][5]));  // step >= compute
  }
  CHECK(rows[0][3] == "100.0");
  // The one-rank baseline trains without DDP: nothing to communicate (issue 33 item 6).
  CHECK(rows[0][6] == "0.00");
  // From 4 ranks on, the group spans two hosts (127.0.0.1 and 127.0.0.2).
  CHECK(n0.Out().find("# from 4 ranks: backend gloo (shared memory within a node, tcp between "
                      "nodes)") != std::string::npos);
  CHECK(Rows(n1.Out()).empty());
  CHECK(n1.Err().find(".scaling4 round 0] starting 2 worker(s): ranks 2-3 of 4, node 1 of 2") !=
        std::string::npos);
  CHECK(n1.Err().find(".scaling1 ") == std::string::npos);
  CHECK(n1.Err().find(".scaling2 ") == std::string::npos);
  CHECK(n0.Err().find(".scaling4 round 0] starting 2 worker(s): ranks 0-1 of 4, node 0 of 2") !=
        std::string::npos);
}

}  // namespace

TEST_CASE("bench --scaling across 2 nodes, static rendezvous: rows 1, 2, 4", "[multiproc]") {
  if (!BenchWorkerBuilt()) return SkipCase("multiproc", "ddprun-bench-worker is not built");
  Harness h;
  const std::vector<std::string> rdzv{"--rdzv_backend=static", "--master_addr=127.0.0.1",
                                      "--master_port=" + std::to_string(FreePort())};
  // Node 1 first: it waits for node 0's store.
  Proc& n1 = StartNode(h, "static", 1, rdzv, {"--node_rank=1"});
  Proc& n0 = StartNode(h, "static", 0, rdzv, {"--node_rank=0"});
  CheckRun(h, n0, n1);
}

TEST_CASE("bench --scaling across 2 nodes through ddprund: rows 1, 2, 4", "[multiproc]") {
  if (!BenchWorkerBuilt()) return SkipCase("multiproc", "ddprun-bench-worker is not built");
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::vector<std::string> rdzv{"--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                      "--rdzv_id=scaling-test"};
  // Node ranks come from the first round: whichever node gets group rank 0
  // prints the table. Both are started the same way.
  Proc& a = StartNode(h, "ddprund", 0, rdzv);
  Proc& b = StartNode(h, "ddprund", 1, rdzv);
  h.Wait(a, 120);
  h.Wait(b, 120);
  Proc& n0 = Rows(a.Out()).empty() ? b : a;
  Proc& n1 = &n0 == &a ? b : a;
  CheckRun(h, n0, n1);
  h.StopDaemon(*daemon);
}

TEST_CASE("bench --scaling across nodes: a node that dies ends the run on the other",
          "[multiproc]") {
  if (!BenchWorkerBuilt()) return SkipCase("multiproc", "ddprun-bench-worker is not built");
  Harness h;
  const std::vector<std::string> rdzv{"--rdzv_backend=static", "--master_addr=127.0.0.1",
                                      "--master_port=" + std::to_string(FreePort())};
  // Long steps: node 0 is still in its one-rank job when node 1 dies.
  const std::vector<std::string> slow{"--compute_ms=3000", "--iters=20"};
  Proc& n1 = StartNode(h, "death", 1, rdzv, {"--node_rank=1", slow[0], slow[1]});
  Proc& n0 = StartNode(h, "death", 0, rdzv, {"--node_rank=0", slow[0], slow[1]});
  // Both nodes in the first job's round: node 0 started its one-rank job.
  const auto t0 = Clock::now();
  while (n0.Err().find(".scaling1 round 0] starting 1 worker(s)") == std::string::npos &&
         SecondsSince(t0) < 60 && !n0.exit) {
    SleepMs(20);
  }
  REQUIRE(n0.Err().find(".scaling1 round 0] starting 1 worker(s)") != std::string::npos);
  ::kill(n1.pid, SIGKILL);
  h.Wait(n1, 10);
  const auto killed = Clock::now();
  const int rc = h.Wait(n0, 20);
  INFO("node 0 stderr:\n" << n0.Err());
  CHECK(rc == ddprun::kExitRendezvousError);
  CHECK(SecondsSince(killed) < 10);
  CHECK(n0.Err().find("was lost, and this job cannot take a replacement node") !=
        std::string::npos);
  CHECK(Rows(n0.Out()).empty());
}
