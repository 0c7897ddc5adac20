// ddprun status and ddprun top against real daemons and jobs: the end of a
// watched job, a refused port, an unknown job (issue 33 item 8).
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE("ddprun status and top on a refused port say so at once", "[multiproc]") {
  Harness h;
  const std::string ep = "127.0.0.1:" + std::to_string(FreePort());
  for (const char* command : {"status", "top"}) {
    // The default --timeout is 5 s; a refusal must not wait for it.
    Proc& p = h.StartDdprun(command, {command, "--rdzv_endpoint", ep});
    CHECK(h.Wait(p, 10) == 3);
    INFO(command << " stderr:\n" << p.Err());
    CHECK(p.Seconds() < 2.5);
    CHECK(p.Err().find("cannot reach the rendezvous at " + ep + " (Connection refused)") !=
          std::string::npos);
    CHECK(Lines(p.Err()).size() == 1);
  }
}

TEST_CASE("ddprun status --rdzv_id of an unknown job is an error, as in top", "[multiproc]") {
  Harness h;
  const int port = h.StartDaemon("ddprund");
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  Proc& p = h.StartDdprun("status", {"status", "--rdzv_endpoint", ep, "--rdzv_id", "nosuch"});
  CHECK(h.Wait(p, 10) == 3);
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  CHECK(p.Err().find("no such job 'nosuch'") != std::string::npos);
  CHECK(p.Out().empty());
}

TEST_CASE("ddprun top says that the job it watches ended, and exits 0", "[multiproc]") {
  Harness h;
  const int port = h.StartDaemon("ddprund");
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  const std::string script = h.Script("w.sh", "#!/bin/sh\nsleep 3\n");
  Proc& job =
      h.StartDdprun("job", {"--nnodes=1", "--rdzv_endpoint=" + ep, "--rdzv_id=watched", script});
  // Watch it from while it runs (top retries nothing: start it once the job is listed).
  const auto t0 = Clock::now();
  bool listed = false;
  for (int i = 0; !listed && SecondsSince(t0) < 10; ++i) {
    Proc& s = h.StartDdprun("status" + std::to_string(i),
                            {"status", "--rdzv_endpoint", ep, "--rdzv_id", "watched"});
    listed = h.Wait(s, 10) == 0 && s.Out().find("running") != std::string::npos;
    if (!listed) SleepMs(100);
  }
  REQUIRE(listed);
  Proc& top = h.StartDdprun("top", {"top", "--rdzv_endpoint", ep, "--job", "watched"});
  CHECK(h.Wait(job, 20) == 0);
  const int rc = h.Wait(top, 20);
  INFO("top stdout:\n" << top.Out() << "top stderr:\n" << top.Err());
  CHECK(rc == 0);
  CHECK(top.Out().find("ddprun top: job watched ended") != std::string::npos);
  CHECK(top.Err().find("CANCELLED") == std::string::npos);
}

TEST_CASE("ddprun status: a job whose only node left while gathering is not listed",
          "[multiproc]") {
  // Issue 33 item 8: it stayed listed, gathering, until its join timeout.
  Harness h;
  const int port = h.StartDaemon("ddprund");
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  const std::string script = h.Script("w.sh", "#!/bin/sh\nexit 0\n");
  Proc& node = h.StartDdprun("node", {"--nnodes=2", "--rdzv_endpoint=" + ep,
                                      "--rdzv_id=alone", "--rdzv_conf=join_timeout=600", script});
  auto listed = [&](int i) {
    Proc& s = h.StartDdprun("status" + std::to_string(i), {"status", "--rdzv_endpoint", ep});
    REQUIRE(h.Wait(s, 10) == 0);
    return s.Out().find("alone") != std::string::npos;
  };
  const auto t0 = Clock::now();
  int i = 0;
  bool seen = false;
  while (!seen && SecondsSince(t0) < 10) {
    seen = listed(i++);
    if (!seen) SleepMs(100);
  }
  REQUIRE(seen);  // gathering, one of two nodes
  ::kill(-node.pid, SIGKILL);
  ::kill(node.pid, SIGKILL);
  h.Wait(node, 5);
  // The daemon notices the broken stream within its keepalive; then the job is gone.
  const auto t1 = Clock::now();
  bool gone = false;
  while (!gone && SecondsSince(t1) < 15) {
    gone = !listed(i++);
    if (!gone) SleepMs(200);
  }
  CHECK(gone);
  CHECK(SecondsSince(t1) < 15);
}
