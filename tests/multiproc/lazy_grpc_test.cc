// A single-node job runs its rendezvous in the ddprun process and loads gRPC
// only when a client reaches it (agent/src/local_rendezvous_session.cc,
// agent/include/ddprun/agent/grpc_module.h): checked on the real process's
// memory map, and the client is served from the same table.
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE("single node: gRPC is loaded only when a client reaches the rendezvous",
          "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  // The worker's parent is ddprun (workers are spawned directly).
  const std::string script =
      "grep -c libgrpc /proc/$PPID/maps > " + out + "/before; " + Ddprun() +
      " status --rdzv_endpoint \"$DDPRUN_STORE_ADDR\" > " + out + "/status 2>&1 || exit 5; " +
      "grep -c libgrpc /proc/$PPID/maps > " + out + "/after; exit 0";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=1", "--rdzv_id=lazy1", "--no_python",
                                     "sh", "-c", script});
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
