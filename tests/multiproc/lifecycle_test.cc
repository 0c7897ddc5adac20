// The rest of an agent's life: the daemon going away mid-job, signals while
// joining, elastic ranges and join tokens.
#include <signal.h>

#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

std::vector<std::string> JobFlags(int port, const std::string& id, const std::string& nnodes,
                                  const std::string& conf, int node) {
  return {"--nnodes=" + nnodes,
          "--nproc_per_node=2",
          "--local_addr=127.0.0." + std::to_string(node + 1),
          "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv_id=" + id,
          "--rdzv_conf=" + conf,
          FixtureWorker()};
}

// A 2-node job of hanging workers on a fresh daemon; returns once all 4 run.
struct HangingJob {
  Proc* daemon = nullptr;
  std::vector<Proc*> agents;
  std::string pids;
  HangingJob(Harness& h) {
    const int port = h.StartDaemon("ddprund", &daemon);
    pids = h.PidDir("pids");
    for (int i = 0; i < 2; ++i)
      agents.push_back(&h.StartDdprun("node" + std::to_string(i),
                                      JobFlags(port, "hang", "2", "join_timeout=20", i),
                                      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}}));
    h.WaitForPids(pids, 4, 20);
  }
};

}  // namespace

TEST_CASE("ddprund stopping mid-job: agents stop their workers and exit 3", "[multiproc]") {
  Harness h;
  HangingJob job(h);
  REQUIRE(::kill(job.daemon->pid, SIGTERM) == 0);
  CHECK(h.Wait(*job.daemon, 10) == 0);
  for (Proc* a : job.agents) {
    const int rc = h.Wait(*a, 10);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 3);
    CHECK(a->Err().find("lost the rendezvous") != std::string::npos);
  }
  h.RequireAllGone(job.pids, 2);
}

TEST_CASE("ddprund SIGKILLed mid-job: agents stop their workers and exit 3", "[multiproc]") {
  Harness h;
  HangingJob job(h);
  REQUIRE(::kill(job.daemon->pid, SIGKILL) == 0);
  CHECK(h.Wait(*job.daemon, 10) == 128 + SIGKILL);
  for (Proc* a : job.agents) {
    const int rc = h.Wait(*a, 15);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 3);
    CHECK(a->Err().find("lost the rendezvous") != std::string::npos);
  }
  h.RequireAllGone(job.pids, 2);
}

TEST_CASE("SIGTERM while waiting for the other nodes: exit 143 at once", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  Proc& a = h.StartDdprun("lone", JobFlags(port, "lonely", "2", "join_timeout=20", 0),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  SleepMs(500);
  REQUIRE_FALSE(a.exit.has_value());
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(a, 10);
  INFO("stderr:\n" << a.Err());
  CHECK(rc == 143);
  CHECK(SecondsSince(t0) < 2.0);
  CHECK(ReadPids(pids).empty());
  h.StopDaemon(*daemon);
}

TEST_CASE("elastic --nnodes=1:2: one node starts alone after last_call_timeout", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  Proc& a = h.StartDdprun("alone",
                          JobFlags(port, "el1", "1:2", "join_timeout=10,last_call_timeout=1", 0),
                          {{"FIXTURE_OUT_DIR", out}, {"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(a, 15);
  INFO("stderr:\n" << a.Err());
  CHECK(rc == 0);
  CHECK(a.Seconds() >= 0.9);  // it waited for the last call
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 2);
  for (const Record& r : recs) {
    CHECK(r.Int("world_size") == 2);
    CHECK(r.Int("group_world_size") == 1);
  }
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*daemon);
}

TEST_CASE("elastic --nnodes=1:2: two nodes joining together form one round", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  std::vector<std::string> outs;
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    // A last call long enough that both nodes are in the first round, which
    // then starts as soon as MAX nodes have joined.
    agents.push_back(&h.StartDdprun(
        "node" + std::to_string(i),
        JobFlags(port, "el2", "1:2", "join_timeout=20,last_call_timeout=10", i),
        {{"FIXTURE_OUT_DIR", outs.back()}, {"FIXTURE_PIDFILE_DIR", pids}}));
  }
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 20);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 0);
    CHECK(a->Seconds() < 8.0);  // MAX reached: no need to wait out the last call
  }
  std::set<long> ranks;
  for (const std::string& out : outs) {
    const std::vector<Record> recs = ReadRecords(out);
    REQUIRE(recs.size() == 2);
    for (const Record& r : recs) {
      CHECK(r.Int("world_size") == 4);
      CHECK(r.Int("group_world_size") == 2);
      CHECK(ranks.insert(r.Int("rank")).second);
    }
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*daemon);
}

TEST_CASE("a node with the wrong join token is refused", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  Proc& a = h.StartDdprun("a", JobFlags(port, "tok", "2", "join_timeout=20,token=secret", 0),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  SleepMs(500);
  Proc& b = h.StartDdprun("b", JobFlags(port, "tok", "2", "join_timeout=20,token=guess", 1),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(b, 10);
  INFO("b stderr:\n" << b.Err());
  CHECK(rc == 3);
  CHECK(b.Err().find("wrong join token") != std::string::npos);
  CHECK(b.Seconds() < 3.0);
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  CHECK(h.Wait(a, 10) == 143);
  CHECK(ReadPids(pids).empty());
  h.StopDaemon(*daemon);
}
