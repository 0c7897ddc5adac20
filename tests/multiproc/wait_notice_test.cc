// Waits say what they wait for (issue 33, item 5; docs/cli.md "Waits"): a
// node whose wait lasts 5 s prints one line with what it waits for, how many
// have joined and until when. Real ddprun processes on loopback: the first
// node of a two-node job, a static node rank 1 before node rank 0, an elastic
// job at its minimum in last_call_timeout, and `ddprun check` of two nodes.
#include <csignal>
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

// Waits (a deadline loop) until p's stderr holds `needle`; returns how long
// it took, or fails with the output.
double AwaitErr(Proc& p, const std::string& needle, double timeout_s) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < timeout_s) {
    if (p.Err().find(needle) != std::string::npos) return SecondsSince(t0);
    SleepMs(50);
  }
  FAIL("no '" << needle << "' within " << timeout_s << " s:\n" << p.Out() << p.Err());
  return -1;
}

std::string LocalEndpoint() { return "127.0.0.1:" + std::to_string(FreePort()); }

}  // namespace

TEST_CASE("waits: the first node of a two-node job says it waits for the other, then runs",
          "[multiproc][waits]") {
  Harness h;
  const std::string ep = LocalEndpoint();
  auto node = [&](const std::string& name) -> Proc& {
    return h.StartDdprun(
        name, {"--nnodes=2", "--nproc_per_node=1", "--rdzv_endpoint=" + ep, "--rdzv_id=wait-first",
               "--rdzv_conf=join_timeout=60", "--no_python", "true"});
  };
  Proc& a = node("a");
  const double after = AwaitErr(
      a, "waiting for the other nodes of this job (--nnodes=2): 1 of 2 nodes have joined; until ",
      20);
  CHECK(after >= 4);  // not before 5 s of waiting (the process started a little earlier)
  CHECK_THAT(a.Err(), Catch::Contains("then exit 3 (--rdzv_conf join_timeout)"));
  Proc& b = node("b");
  CHECK(h.Wait(a, 30) == 0);
  CHECK(h.Wait(b, 30) == 0);
  // One line, not one per wake-up.
  std::size_t lines = 0;
  for (const std::string& l : Lines(a.Err())) lines += l.find("waiting for the other") != l.npos;
  CHECK(lines == 1);
}

TEST_CASE("waits: a static node rank 1 says it waits for node rank 0, then runs",
          "[multiproc][waits]") {
  Harness h;
  const int port = FreePort();
  auto node = [&](const std::string& name, int rank) -> Proc& {
    return h.StartDdprun(
        name, {"--nnodes=2", "--node_rank=" + std::to_string(rank), "--master_addr=127.0.0.1",
               "--master_port=" + std::to_string(port), "--nproc_per_node=1",
               "--rdzv_conf=timeout=60", "--no_python", "true"});
  };
  Proc& b = node("b", 1);
  AwaitErr(b,
           "waiting for node rank 0 (--master_addr/--master_port 127.0.0.1:" +
               std::to_string(port) + "): its store has not answered yet",
           20);
  CHECK_THAT(b.Err(), Catch::Contains("then exit 3 (--rdzv_conf join_timeout)"));
  Proc& a = node("a", 0);
  CHECK(h.Wait(a, 30) == 0);
  CHECK(h.Wait(b, 30) == 0);
}

TEST_CASE("waits: an elastic job at its minimum says it waits last_call_timeout for more",
          "[multiproc][waits]") {
  Harness h;
  Proc& a = h.StartDdprun(
      "a", {"--nnodes=1:2", "--nproc_per_node=1", "--rdzv_endpoint=" + LocalEndpoint(),
            "--rdzv_id=wait-min", "--rdzv_conf=last_call_timeout=9", "--no_python", "true"});
  AwaitErr(a,
           "the job has its minimum of 1 nodes; waiting --rdzv_conf last_call_timeout (9 s) for "
           "more, up to 2: 1 of 2 nodes have joined; until ",
           20);
  CHECK_THAT(a.Err(), Catch::Contains("then the round starts with the nodes that joined"));
  CHECK(h.Wait(a, 30) == 0);
}

TEST_CASE("waits: ddprun check of two nodes says it waits for the other node",
          "[multiproc][waits]") {
  Harness h;
  const std::string script = h.Script("train.sh", "exit 0\n");
  Proc& a = h.StartDdprun(
      "a", {"check", "--nnodes=2", "--nproc_per_node=1", "--rdzv_endpoint=" + LocalEndpoint(),
            "--rdzv_id=wait-check", "--no_python", "sh", script});
  AwaitErr(a, "waiting for the other nodes of this job (--nnodes=2): 1 of 2 nodes have joined", 20);
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  h.Wait(a, 30);
}
