// A single-node job runs its rendezvous in the ddprun process and loads gRPC
// only when a client reaches it (agent/src/local_rendezvous_session.cc,
// agent/include/ddprun/agent/grpc_module.h): checked on the real process's
// memory map, and the client is served from the same table.
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE("single node: gRPC is loaded only when a client reaches the rendezvous", "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  // The worker's parent is ddprun (workers are spawned directly).
  const std::string script = "grep -c libgrpc /proc/$PPID/maps > " + out + "/before; " + Ddprun() +
                             " status --rdzv_endpoint \"$DDPRUN_STORE_ADDR\" > " + out +
                             "/status 2>&1 || exit 5; " + "grep -c libgrpc /proc/$PPID/maps > " +
                             out + "/after; exit 0";
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=1", "--rdzv_id=lazy1", "--no_python", "sh", "-c", script});
  const int rc = h.Wait(p, 30);
  INFO("stderr: " << p.Err() << "\nstatus: " << ReadFile(out + "/status"));
  REQUIRE(rc == 0);
  CHECK(ReadFile(out + "/before") == "0\n");
  // `ddprun status` was served over gRPC from the agent's own table.
  const std::string status = ReadFile(out + "/status");
  CHECK(status.find("lazy1") != std::string::npos);
  CHECK(status.find("running") != std::string::npos);
  CHECK(ReadFile(out + "/after") != "0\n");
}

// Monitoring on the in-process rendezvous: the dashboard's HTTP port serves
// the job and its ranks (the agent's reports reach the in-process hub) with
// gRPC never loaded; `ddprun top` then reads the same hub over gRPC.
TEST_CASE("single node: the dashboard serves without gRPC, and ddprun top reads the same hub",
          "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  const int port = FreePort();
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/api/v1/jobs/dash1";
  // Polls the JSON API until this rank's report has arrived (about once a second).
  const std::string fetch =
      "import json, sys, time, urllib.request\n"
      "for _ in range(150):\n"
      "    body = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()\n"
      "    if json.loads(body).get(\"ranks\"): break\n"
      "    time.sleep(0.1)\n"
      "open(sys.argv[2], \"w\").write(body)\n";
  const std::string script = "python3 -c '" + fetch + "' " + url + " " + out + "/jobs || exit 5; " +
                             "grep -c libgrpc /proc/$PPID/maps > " + out + "/before; " + Ddprun() +
                             " top --once --rdzv_endpoint \"$DDPRUN_STORE_ADDR\" --job dash1 > " +
                             out + "/top 2>&1 || exit 6; exit 0";
  Proc& p =
      h.StartDdprun("ddprun", {"--nproc_per_node=1", "--rdzv_id=dash1", "--no_python",
                               "--dashboard_port=" + std::to_string(port), "sh", "-c", script});
  const int rc = h.Wait(p, 60);
  INFO("stderr: " << p.Err() << "\njobs: " << ReadFile(out + "/jobs")
                  << "\ntop: " << ReadFile(out + "/top"));
  REQUIRE(rc == 0);
  CHECK(p.Err().find("dashboard at http://127.0.0.1:" + std::to_string(port) + "/") !=
        std::string::npos);
  const std::string jobs = ReadFile(out + "/jobs");
  CHECK(jobs.find("\"job_id\":\"dash1\"") != std::string::npos);
  CHECK(jobs.find("\"rank\":0") != std::string::npos);
  CHECK(ReadFile(out + "/before") == "0\n");
  const std::string top = ReadFile(out + "/top");
  CHECK(top.find("job dash1") != std::string::npos);
  CHECK(top.find("running") != std::string::npos);
}
