// The [sdk] tier: the worker SDK on Gloo under the real ddprun, 1-4 ranks.
// The collective and Reducer checks that the thread harness shares
// (tests/support/group_checks.h: every dtype and op, broadcast from every
// root, allgather, reduce-scatter, barrier, Reducer bucketing, averaging and
// views) run at 2-4 ranks as threads in unit_worker_sdk_tests (shared memory)
// and integration_worker_sdk_tests (Gloo TCP), in seconds; here the whole
// [collectives] and [reducer] sets run as real processes at 1 and 3 ranks
// (3: the odd size, where the rings chunk unevenly) on both transports.
// Each case runs build/bin/ddprun --nproc_per_node=N sdk_worker <filter>;
// the Catch2 checks run on every rank (tests/sdk/worker/sdk_worker.cc).
// Ranks on one host use the shared memory path by default; each case runs
// again with DDP_SHM=0 over Gloo's TCP transport (the path of multi-node jobs).
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

std::string SdkWorker() { return Bin("sdk_worker"); }

// ddprun's flags, then sdk_worker running the cases of `filter` (failing when none matches).
std::vector<std::string> WorkerJob(std::vector<std::string> flags, const std::string& filter) {
  flags.push_back("--no_python");
  return Concat(std::move(flags), CatchRun(SdkWorker(), filter));
}

// The two transports of CPU groups: DDP_SHM's values.
constexpr const char* kTransports[] = {"1", "0"};
const char* TransportName(const std::string& shm) { return shm == "1" ? "shm" : "tcp"; }

// Runs the filter at world size n; requires success and prints the ranks' output.
void RunRanks(int n, const std::string& filter, const std::string& shm = "1",
              double timeout_s = 240) {
  Harness h;
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=" + std::to_string(n)}, filter),
                          {{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM", shm}});
  const int rc = h.Wait(p, timeout_s);
  INFO("world size " << n << ", filter " << filter << ", " << TransportName(shm) << "\nstdout:\n"
                     << p.Out() << "\nstderr:\n"
                     << p.Err());
  REQUIRE(rc == 0);
}

// A job expected to fail: sdk_worker <filter> at `ranks` ranks, whose ranks
// report their error in SDK_RESULT_FILE.<rank> (ErrorReport's format).
struct FailedJob {
  int rc;
  std::string rank0, rank1;  // the reports of ranks 0 and 1
  std::string err;           // ddprun's stderr
};
FailedJob RunFailing(int ranks, const std::string& grace_s, const std::string& filter, EnvList env,
                     double timeout_s = 60) {
  Harness h;
  const std::string result = h.dir() + "/result";
  env.push_back({"SDK_RESULT_FILE", result});
  Proc& p = h.StartDdprun(
      "ddprun",
      WorkerJob({"--nproc_per_node=" + std::to_string(ranks), "--grace_period=" + grace_s}, filter),
      env);
  const int rc = h.Wait(p, timeout_s);
  return FailedJob{rc, ReadFile(result + ".0"), ReadFile(result + ".1"), p.Err()};
}

// The seconds=<s> field of a report.
double Seconds(const std::string& report) {
  return std::stod(report.substr(report.find("seconds=") + 8));
}

}  // namespace

// World sizes of the process tier beyond 1 (see the top of this file).
constexpr int kProcessWorlds[] = {3};

TEST_CASE("collectives match a local reference at 1 and 3 ranks", "[sdk]") {
  RunRanks(1, "[collectives]");
  for (const char* shm : kTransports) {
    for (int n : kProcessWorlds) {
      DYNAMIC_SECTION(TransportName(shm) << ", world size " << n) {
        RunRanks(n, "[collectives]", shm);
      }
    }
  }
}

TEST_CASE("reducer at 1 and 3 ranks", "[sdk]") {
  RunRanks(1, "[reducer]");
  for (const char* shm : kTransports) {
    for (int n : kProcessWorlds) {
      DYNAMIC_SECTION(TransportName(shm) << ", world size " << n) { RunRanks(n, "[reducer]", shm); }
    }
  }
}

TEST_CASE("bad input at 1 and 3 ranks", "[sdk]") {
  RunRanks(1, "[bad-input]");
  RunRanks(3, "[bad-input]");
}

TEST_CASE("a peer killed mid-collective: an error within the timeout, no hang", "[sdk]") {
  // Large (chunked) and small (latency paths: over TCP, Gloo's sync-mode
  // rings, plain at two ranks and chunked at three) collectives, on both
  // transports.
  struct Case {
    const char* shm;
    int ranks;
    const char* count;
  };
  const Case cases[] = {{"1", 3, "16777216"},
                        {"0", 3, "16777216"},
                        {"1", 2, "1024"},
                        {"0", 2, "1024"},
                        {"0", 3, "1024"}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(TransportName(c.shm) << ", " << c.ranks << " ranks, " << c.count << " floats") {
      const FailedJob job =
          RunFailing(c.ranks, "20", "[kill]",
                     {{"DDP_TIMEOUT_SEC", "10"}, {"DDP_SHM", c.shm}, {"SDK_KILL_COUNT", c.count}});
      const std::string& r0 = job.rank0;
      INFO("rank 0 reported: " << r0 << "\nddprun stderr:\n" << job.err);
      REQUIRE(job.rc != 0);
      REQUIRE(r0.find("code=") != std::string::npos);
      REQUIRE(r0.find(std::string("allreduce(") + c.count + " x f32, sum)") != std::string::npos);
      if (std::string(c.shm) == "1") {
        // The shared memory path names the dead peer.
        REQUIRE(r0.find("rank 1 (pid ") != std::string::npos);
      }
      REQUIRE(r0.find("round 0") != std::string::npos);
      // Seconds until the error: well within the 10 s timeout (a closed connection).
      REQUIRE(Seconds(r0) < 10.0);
      REQUIRE(r0.find("then=") != std::string::npos);  // later calls refuse, naming the failure
    }
  }
}

TEST_CASE("a peer killed with SIGKILL: every survivor gets PeerLostError naming it at once",
          "[sdk]") {
  // 4 ranks all-reduce in a loop and rank 2 SIGKILLs itself. Every survivor
  // must get PeerLostError naming rank 2 well before the 30 s group timeout:
  // within 2 s of the kill here (a loaded 2-core machine; the figure, goal
  // 100 ms, is bench/sdk_recovery.sh's). Small all-reduces (the
  // caller-run and sync-ring paths) and chunked ones, on both transports.
  struct Case {
    const char* shm;
    const char* count;
  };
  const Case cases[] = {{"1", "1024"}, {"1", "4194304"}, {"0", "1024"}, {"0", "4194304"}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(TransportName(c.shm) << ", 4 ranks, " << c.count << " floats") {
      Harness h;
      const std::string result = h.dir() + "/result";
      Proc& p = h.StartDdprun("ddprun",
                              WorkerJob({"--nproc_per_node=4", "--grace_period=20"}, "[peer-lost]"),
                              {{"SDK_RESULT_FILE", result},
                               {"DDP_TIMEOUT_SEC", "30"},
                               {"DDP_SHM", c.shm},
                               {"SDK_VICTIM", "2"},
                               {"SDK_KILL_COUNT", c.count}});
      const int rc = h.Wait(p, 90);
      INFO("ddprun stderr:\n" << p.Err());
      REQUIRE(rc != 0);
      for (int r : {0, 1, 3}) {
        const std::string report = ReadFile(result + "." + std::to_string(r));
        INFO("rank " << r << " reported: " << report);
        REQUIRE(report.find("code=peer lost") != std::string::npos);
        REQUIRE(report.find("lost_rank=2") != std::string::npos);
        REQUIRE(report.find("rank 2") != std::string::npos);
        REQUIRE(report.find("round 0") != std::string::npos);
        const double latency_ms = std::stod(report.substr(report.find("latency_ms=") + 11));
        std::printf("peer lost (%s, %s floats): rank %d's error %.1f ms after the kill\n",
                    TransportName(c.shm), c.count, r, latency_ms);
        REQUIRE(latency_ms >= 0);
        REQUIRE(latency_ms < 2000);
      }
    }
  }
}

TEST_CASE("a hung peer: a timeout error after the group timeout", "[sdk]") {
  for (const char* shm : kTransports) {
    DYNAMIC_SECTION(TransportName(shm)) {
      const FailedJob job =
          RunFailing(2, "2", "[hang]", {{"DDP_TIMEOUT_SEC", "3"}, {"DDP_SHM", shm}});
      const std::string& r0 = job.rank0;
      INFO("rank 0 reported: " << r0 << "\nddprun stderr:\n" << job.err);
      REQUIRE(job.rc != 0);
      REQUIRE(r0.find("code=timeout") != std::string::npos);
      REQUIRE(r0.find("round 0") != std::string::npos);
      REQUIRE(Seconds(r0) >= 2.5);
      REQUIRE(Seconds(r0) < 10.0);
    }
  }
}

TEST_CASE("a filter that matches no case fails the job (-w NoTests)", "[sdk]") {
  // Without -w NoTests, Catch2 v2 exits 0 here and the job would pass
  // without running a single check.
  Harness h;
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=1"}, "[no-such-tag]"));
  const int rc = h.Wait(p, 60);
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc != 0);
  REQUIRE(p.Out().find("No test cases matched '[no-such-tag]'") != std::string::npos);
}

TEST_CASE("outside ddprun, Init says so and shows how to run", "[sdk]") {
  Harness h;
  Proc& p = h.Start("bare", CatchRun(SdkWorker(), "[collectives]"),
                    {{"DDPRUN_STORE_ADDR", ""}, {"RANK", ""}});
  const int rc = h.Wait(p, 30);
  REQUIRE(rc != 0);
  const std::string all = p.Out() + p.Err();
  REQUIRE(all.find("DDPRUN_STORE_ADDR is not set") != std::string::npos);
  REQUIRE(all.find("ddprun --nproc_per_node=2 ./trainer") != std::string::npos);
}

TEST_CASE("a wrong token is refused with an auth error", "[sdk]") {
  Harness h;
  // Overriding DDPRUN_TOKEN in the launcher's environment would be replaced by
  // the agent; the worker rewrites it itself when SDK_WRONG_TOKEN is set.
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=1"}, "[wrong-token]"));
  const int rc = h.Wait(p, 60);
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
}

TEST_CASE("two hosts with two ranks each: hierarchical all-reduce (shm, then TCP leaders)",
          "[sdk]") {
  // Two agents on loopback (127.0.0.1 hosts the embedded rendezvous); each
  // node's ranks get their own DDP_SHM_HOST_ID, so the SDK sees two hosts.
  for (const char* filter : {"[collectives]", "[reducer]"}) {
    DYNAMIC_SECTION(filter) {
      Harness h;
      const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
      auto node = [&](const std::string& name, const std::string& addr, const std::string& id) {
        return &h.StartDdprun(name,
                              WorkerJob({"--nnodes=2", "--nproc_per_node=2", endpoint,
                                         "--rdzv_id=hier", "--local_addr=" + addr},
                                        filter),
                              {{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM_HOST_ID", id}});
      };
      Proc* a = node("node-a", "127.0.0.1", "host-a");
      Proc* b = node("node-b", "127.0.0.2", "host-b");
      const int ra = h.Wait(*a, 240);
      const int rb = h.Wait(*b, 240);
      INFO("node a:\n" << a->Out() << a->Err() << "\nnode b:\n" << b->Out() << b->Err());
      REQUIRE(ra == 0);
      REQUIRE(rb == 0);
    }
  }
}

// Issue 33 item 9b: hosts with different numbers of ranks (2 and 1, as
// --nproc_per_node differs between the nodes): the SDK reads each node's
// LOCAL_WORLD_SIZE and learns the layout from the store, so the hierarchical
// all-reduce (shm on host a, the leaders over TCP) and the rest match the
// local reference at world size 3.
TEST_CASE("two hosts with 2 and 1 ranks (different --nproc_per_node): collectives and reducer",
          "[sdk]") {
  for (const char* filter : {"[collectives]", "[reducer]"}) {
    DYNAMIC_SECTION(filter) {
      Harness h;
      const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
      auto node = [&](const std::string& name, const std::string& addr, int nproc,
                      const std::string& id) {
        return &h.StartDdprun(name,
                              WorkerJob({"--nnodes=2", "--nproc_per_node=" + std::to_string(nproc),
                                         endpoint, "--rdzv_id=mixed", "--local_addr=" + addr},
                                        filter),
                              {{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM_HOST_ID", id}});
      };
      Proc* a = node("node-a", "127.0.0.1", 2, "host-a");
      Proc* b = node("node-b", "127.0.0.2", 1, "host-b");
      const int ra = h.Wait(*a, 240);
      const int rb = h.Wait(*b, 240);
      INFO("node a:\n" << a->Out() << a->Err() << "\nnode b:\n" << b->Out() << b->Err());
      REQUIRE(ra == 0);
      REQUIRE(rb == 0);
      CHECK(a->Err().find("ranks 0-1 of 3") != std::string::npos);
      CHECK(b->Err().find("ranks 2-2 of 3") != std::string::npos);
    }
  }
}

TEST_CASE("a restarted job bootstraps round 1's communicator on both paths", "[sdk]") {
  for (const char* shm : kTransports) {
    DYNAMIC_SECTION(TransportName(shm)) {
      Harness h;
      const std::string result = h.dir() + "/result";
      Proc& p = h.StartDdprun(
          "ddprun", WorkerJob({"--nproc_per_node=3", "--max_restarts=1"}, "[restart]"),
          {{"DDP_TIMEOUT_SEC", "30"}, {"DDP_SHM", shm}, {"SDK_RESULT_FILE", result}});
      const int rc = h.Wait(p, 120);
      INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
      REQUIRE(rc == 0);
      for (int r = 0; r < 3; ++r)
        REQUIRE(ReadFile(result + "." + std::to_string(r)) == "round=1\n");
    }
  }
}

TEST_CASE("ranks that all-reduce different sizes get an error on both paths", "[sdk]") {
  for (const char* shm : kTransports) {
    DYNAMIC_SECTION(TransportName(shm)) {
      const FailedJob job =
          RunFailing(2, "2", "[mismatch]", {{"DDP_TIMEOUT_SEC", "5"}, {"DDP_SHM", shm}});
      const std::string& r0 = job.rank0;
      INFO("rank 0 reported: " << r0 << "\nddprun stderr:\n" << job.err);
      REQUIRE(job.rc != 0);
      REQUIRE(r0.find("code=") != std::string::npos);
      REQUIRE(Seconds(r0) < 5.0);
      if (std::string(shm) == "1") {
        // Every rank names both collectives.
        REQUIRE(r0.find("code=invalid argument") != std::string::npos);
        REQUIRE(r0.find("allreduce(1024 x f32, sum)") != std::string::npos);
        REQUIRE(job.rank1.find("allreduce(1000 x f32, sum)") != std::string::npos);
      }
    }
  }
}
