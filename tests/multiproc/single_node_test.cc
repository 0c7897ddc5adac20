// Single-node jobs: ddprun hosts a private rendezvous, no daemon.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE("single node, nproc 4: every rank once, one MASTER_PORT", "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=4", FixtureWorker()},
                          {{"FIXTURE_OUT_DIR", out}, {"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(p, 20);
  INFO("stderr: " << p.Err());
  REQUIRE(rc == 0);

  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 4);
  std::set<long> ranks, local_ranks, ports;
  std::set<std::string> run_ids;
  for (const Record& r : recs) {
    INFO(r.file);
    ranks.insert(r.Int("rank"));
    local_ranks.insert(r.Int("local_rank"));
    ports.insert(r.Int("master_port"));
    run_ids.insert(r.Str("run_id"));
    CHECK(r.Int("rank") == r.Int("local_rank"));
    CHECK(r.Int("world_size") == 4);
    CHECK(r.Int("local_world_size") == 4);
    CHECK(r.Int("group_rank") == 0);
    CHECK(r.Int("group_world_size") == 1);
    CHECK(r.Int("restart_count") == 0);
    CHECK(r.Str("master_addr") == "127.0.0.1");
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  CHECK(local_ranks == std::set<long>{0, 1, 2, 3});
  REQUIRE(ports.size() == 1);
  CHECK(*ports.begin() > 0);
  CHECK(run_ids.size() == 1);
  // Every worker also printed its line to the launcher's stdout.
  std::size_t fixture_lines = 0;
  for (const std::string& line : Lines(p.Out()))
    if (line.rfind("FIXTURE ", 0) == 0) ++fixture_lines;
  CHECK(fixture_lines == 4);

  CHECK(ReadPids(pids).size() == 4);
  h.RequireAllGone(pids, 2);
}

TEST_CASE("twenty single-node jobs at once all succeed (MASTER_PORT never races)", "[multiproc]") {
  Harness h;
  constexpr int kJobs = 20;
  std::vector<Proc*> jobs;
  std::vector<std::string> outs, pid_dirs;
  for (int i = 0; i < kJobs; ++i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    pid_dirs.push_back(h.PidDir("pids" + std::to_string(i)));
    jobs.push_back(&h.StartDdprun("job" + std::to_string(i),
                                  {"--nproc_per_node=2", FixtureWorker()},
                                  {{"FIXTURE_OUT_DIR", outs.back()},
                                   {"FIXTURE_PIDFILE_DIR", pid_dirs.back()},
                                   // Keep the workers (and so every job's store) alive together.
                                   {"FIXTURE_SLEEP_MS", "300"}}));
  }
  std::set<long> ports_seen;
  for (int i = 0; i < kJobs; ++i) {
    Proc& p = *jobs[i];
    const int rc = h.Wait(p, 30);
    INFO("job " << i << " stderr: " << p.Err());
    CHECK(rc == 0);
    const std::vector<Record> recs = ReadRecords(outs[i]);
    REQUIRE(recs.size() == 2);
    std::set<long> ranks, ports;
    std::set<std::string> run_ids;
    for (const Record& r : recs) {
      ranks.insert(r.Int("rank"));
      ports.insert(r.Int("master_port"));
      run_ids.insert(r.Str("run_id"));
      CHECK(r.Int("world_size") == 2);
    }
    CHECK(ranks == std::set<long>{0, 1});
    REQUIRE(ports.size() == 1);
    CHECK(*ports.begin() > 0);
    CHECK(run_ids.size() == 1);
    ports_seen.insert(*ports.begin());
  }
  // Jobs that overlap in time necessarily got distinct store ports; jobs
  // that did not may reuse one, so this only guards against a fixed port.
  CHECK(ports_seen.size() > 1);
  for (const std::string& d : pid_dirs) h.RequireAllGone(d, 2);
}

TEST_CASE(
    "torchrun's command line: --master_addr/--master_port, no backend: the store is on "
    "MASTER_PORT",
    "[multiproc]") {
  // torchrun's default backend is static: node rank 0 hosts the store on
  // --master_port, and tcp://MASTER_ADDR:MASTER_PORT (or env://) reaches it.
  // Each worker connects to MASTER_ADDR:MASTER_PORT before it reports: a
  // worker left waiting for a store that nobody hosts fails at once here.
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  const std::string script = h.dir() + "/connect_then_report.sh";
  {
    std::ofstream(script) << "#!/bin/bash\n"
                             "exec 3<>\"/dev/tcp/$MASTER_ADDR/$MASTER_PORT\" || "
                             "{ echo \"no store at $MASTER_ADDR:$MASTER_PORT\" >&2; exit 7; }\n"
                             "exec 3>&-\n"
                             "exec \"$FIXTURE_BIN\"\n";
  }
  ::chmod(script.c_str(), 0755);
  const int port = FreePort();
  Proc& p = h.StartDdprun(
      "ddprun",
      {"--master_addr=127.0.0.1", "--master_port=" + std::to_string(port), "--nproc_per_node=2",
       script},
      {{"FIXTURE_OUT_DIR", out}, {"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_BIN", FixtureWorker()}});
  const int rc = h.Wait(p, 20);
  INFO("stderr: " << p.Err());
  REQUIRE(rc == 0);
  CHECK(p.Err().find("ignored") == std::string::npos);  // no "master flags ignored" warning
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 2);
  std::set<long> ranks;
  for (const Record& r : recs) {
    ranks.insert(r.Int("rank"));
    CHECK(r.Str("master_addr") == "127.0.0.1");
    CHECK(r.Int("master_port") == port);
    CHECK(r.Int("world_size") == 2);
    CHECK(r.Str("run_id") == "none");  // torchrun's default id
  }
  CHECK(ranks == std::set<long>{0, 1});
  h.RequireAllGone(pids, 2);
}

// Issue 33 item 9: a static job whose master address is loopback serves its
// store, rendezvous and dashboard on loopback alone and says so, as c10d's
// single-node TCPStore; a node that finds no master names its timeout in
// whole seconds ("within 1 s", not "within 0.999969s").
TEST_CASE("a static job on a loopback master binds and advertises 127.0.0.1", "[multiproc]") {
  Harness h;
  const int port = FreePort();
  const std::string script = h.Script("w.sh", "#!/bin/sh\nsleep 2\n");
  Proc& p =
      h.StartDdprun("static", {"--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
                               "--nnodes=1", "--node_rank=0", script});
  // The master port's listening socket, from /proc/net/tcp (bounded wait).
  char hex_port[8];
  std::snprintf(hex_port, sizeof(hex_port), "%04X", port);
  std::string listener;
  const auto t0 = Clock::now();
  while (listener.empty() && SecondsSince(t0) < 10) {
    for (const std::string& line : Lines(ReadFile("/proc/net/tcp"))) {
      // "  0: 0100007F:7531 00000000:0000 0A ...": local address, remote, state (0A = LISTEN)
      const std::size_t colon = line.find(':', line.find(':') + 1);
      if (colon == std::string::npos || line.compare(colon + 1, 4, hex_port) != 0) continue;
      if (line.find(" 0A ") == std::string::npos) continue;
      listener = line.substr(colon - 8, 8);
    }
    if (listener.empty()) SleepMs(20);
  }
  CHECK(listener == "0100007F");  // 127.0.0.1, not 00000000 (every interface)
  CHECK(h.Wait(p, 20) == 0);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  CHECK(err.find("dashboard at http://127.0.0.1:") != std::string::npos);

  Proc& lone = h.StartDdprun(
      "lone", {"--master_addr=127.0.0.1", "--master_port=" + std::to_string(FreePort()),
               "--nnodes=2", "--node_rank=1", "--rdzv_conf", "join_timeout=1", script});
  CHECK(h.Wait(lone, 20) == 3);
  const std::string lone_err = lone.Err();
  INFO("lone stderr:\n" << lone_err);
  CHECK(lone_err.find("within 1 s (cannot connect to the TCPStore at 127.0.0.1:") !=
        std::string::npos);
  CHECK(lone_err.find("within 1 s: ") != std::string::npos);
  CHECK(lone_err.find("0.99") == std::string::npos);
}
