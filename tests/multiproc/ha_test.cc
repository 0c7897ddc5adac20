// The replicated control plane (docs/ha.md) against a real 3-member etcd on
// loopback: ddprund replicas that elect a leader, agents that fail over
// between them, workers that never notice.
#include <signal.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "support/etcd_cluster.h"
#include "support/ha_replicas.h"
#include "support/process_helpers.h"
#include "support/skip.h"
#include "support/tls_certs.h"

using namespace ddprun::test;
namespace rdzv = ddprun::rendezvous;

TEST_CASE(
    "ha: kill -9 the leading replica mid-job, then fail a worker: the other replica "
    "serves, store keys survive, workers untouched",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3);
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd), StartReplica(h, "r1", etcd)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  const std::vector<Proc*> agents =
      StartTwoNodeJob(h, {Endpoints(replicas), Endpoints(replicas)}, "hajob",
                      {{"FIXTURE_PIDFILE_DIR", pids},
                       {"FIXTURE_OUT_DIR", out},
                       {"FIXTURE_SLEEP_MS", "4000"},
                       {"FIXTURE_FAIL_RANK", "3"},
                       {"FIXTURE_FAIL_ONLY_RESTART", "0"},
                       {"FIXTURE_EXIT_CODE", "7"}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, 4, 20);
  // A key in the job's store (a worker's view: token and round of its env).
  std::vector<Record> first;
  const auto t0 = Clock::now();
  while ((first = ReadRecords(out)).size() < 4 && SecondsSince(t0) < 5) SleepMs(10);
  REQUIRE(first.size() == 4);
  rdzv::StoreScope scope{"hajob", first[0].Str("store_token"), first[0].round};
  {
    rdzv::GrpcStore store("127.0.0.1", replicas[leader].port, scope);
    REQUIRE(store.Set("before-failover", "kept").ok());
  }
  // kill -9 the leader: the standby leads within the lease TTL, and every
  // agent re-attaches there with its workers running.
  const auto killed_at = Clock::now();
  REQUIRE(::kill(replicas[leader].proc->pid, SIGKILL) == 0);
  h.Wait(*replicas[leader].proc, 5);
  const int next = WaitLeader(replicas, 10);
  REQUIRE(next == 1 - leader);
  INFO("the standby led after " << SecondsSince(killed_at) << " s");
  for (pid_t w : workers) CHECK(IsAlive(w));
  {
    rdzv::GrpcStore store("127.0.0.1", replicas[next].port, scope);
    auto v = store.Get("before-failover", std::chrono::seconds(2));
    REQUIRE(v.ok());
    CHECK(*v == "kept");
  }
  // Rank 3 fails (exit 7) at 4 s: one restart through the new leader, then success.
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 40);
    INFO(a->name << " stderr:\n" << a->Err() << "\nleader stderr:\n" << replicas[next].proc->Err());
    CHECK(rc == 0);
    CHECK(a->Err().find("re-attached") != std::string::npos);
  }
  std::set<long> first_round, second_round;
  for (const Record& r : ReadRecords(out)) {
    if (r.Int("restart_count") == 0) first_round.insert(r.Int("rank"));
    if (r.Int("restart_count") == 1) second_round.insert(r.Int("rank"));
    CHECK(r.Int("restart_count") <= 1);
  }
  CHECK(first_round == std::set<long>{0, 1, 2, 3});
  CHECK(second_round == std::set<long>{0, 1, 2, 3});
  // Round 1's workers are new processes (the restart); the kill restarted none:
  // every record of round 0 came from the workers that ran through it.
  for (pid_t p : ReadPids(pids))
    CHECK(std::find(workers.begin(), workers.end(), p) == workers.end());
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*replicas[next].proc);
}

// A leader alive but answering nothing (SIGSTOP: its kernel still takes the
// bytes) for longer than its agents' keepalive answer (500 ms with a replica
// list) and shorter than its lease: the agents drop their streams, find no
// other replica leading, and re-attach to it when it runs again. It must hold
// their seats (docs/ha.md, "A stalled ddprund"): counted as lost nodes, this
// job, with no restart allowed, would end.
TEST_CASE(
    "ha: the leader stopped for 1.5 s (past the agents' keepalive, within its lease): the "
    "agents re-attach to it and the round goes on",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  // TTL 5: the stop must not cost the leader its lease.
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd, {}, "5"),
                                StartReplica(h, "r1", etcd, {}, "5")};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  const std::vector<Proc*> agents = StartTwoNodeJob(
      h, {Endpoints(replicas), Endpoints(replicas)}, "stall",
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_OUT_DIR", out}, {"FIXTURE_SLEEP_MS", "3500"}}, "0");
  const std::vector<pid_t> workers = h.WaitForPids(pids, 4, 20);
  Proc& lead = *replicas[leader].proc;
  REQUIRE(::kill(lead.pid, SIGSTOP) == 0);
  SleepMs(1500);  // the length of the stop is the test, not a synchronisation
  REQUIRE(::kill(lead.pid, SIGCONT) == 0);
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 20);
    INFO(a->name << " stderr:\n" << a->Err() << "\nleader stderr:\n" << lead.Err());
    CHECK(rc == 0);
    CHECK(a->Err().find("re-attached to the rendezvous; the round goes on") != std::string::npos);
  }
  CHECK(ReadPids(pids).size() == 4);  // one round, each worker started once
  for (const Record& r : ReadRecords(out)) CHECK(r.Int("restart_count") == 0);
  CHECK(WaitLeader(replicas, 1) == leader);  // it kept its lease
  h.RequireAllGone(workers, 2);
  for (Replica& r : replicas) h.StopDaemon(*r.proc);
}

TEST_CASE("ha: two agents failing at once, each starting at a different replica: one restart",
          "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3);
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd), StartReplica(h, "r1", etcd)};
  REQUIRE(WaitLeader(replicas, 10) >= 0);
  const std::string out = h.MakeDir("out");
  // Node 0 lists r0 first, node 1 lists r1 first: one of them starts at the standby.
  const std::vector<std::string> lists{Endpoints(replicas), Endpoints({replicas[1], replicas[0]})};
  const std::vector<Proc*> agents = StartTwoNodeJob(h, lists, "both",
                                                    {{"FIXTURE_OUT_DIR", out},
                                                     {"FIXTURE_SLEEP_MS", "300"},
                                                     {"FIXTURE_FAIL_ONLY_RESTART", "0"},
                                                     {"FIXTURE_EXIT_CODE", "5"}},
                                                    "3");
  for (Proc* a : agents) {
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(h.Wait(*a, 30) == 0);
  }
  // Every worker of both nodes failed at once in round 0: the job restarted
  // exactly once (one counter increment), and round 1 succeeded.
  std::set<long> restarts;
  for (const Record& r : ReadRecords(out)) restarts.insert(r.Int("restart_count"));
  CHECK(restarts == std::set<long>{0, 1});
  for (Replica& r : replicas) h.StopDaemon(*r.proc);
}

TEST_CASE(
    "ha: bad etcd set-ups are one line and exit 1: unreachable, foreign data; two "
    "clusters on two prefixes each elect their own leader",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  const int dead = FreePort();
  Proc& unreachable =
      h.Start("unreachable", {Ddprund(), "--dashboard_port", "0", "--host", "127.0.0.1", "--port",
                              "0", "--etcd_endpoints", "127.0.0.1:" + std::to_string(dead)});
  CHECK(h.Wait(unreachable, 10) == 1);
  CHECK(unreachable.Err().find("etcd unreachable (127.0.0.1:" + std::to_string(dead)) !=
        std::string::npos);
  CHECK(unreachable.Err().find("start etcd or fix --etcd_endpoints") != std::string::npos);
  const std::string unreachable_err = unreachable.Err();
  CHECK(std::count(unreachable_err.begin(), unreachable_err.end(), '\n') == 1);

  EtcdCluster etcd(h, 1);
  auto client = etcd.Client();
  REQUIRE(client->Put("/other/config", "not ddprun's").ok());
  Proc& foreign =
      h.Start("foreign", {Ddprund(), "--dashboard_port", "0", "--host", "127.0.0.1", "--port", "0",
                          "--etcd_endpoints", etcd.endpoints(), "--etcd_prefix", "/other"});
  CHECK(h.Wait(foreign, 10) == 1);
  CHECK(foreign.Err().find("etcd key '/other/config' under --etcd_prefix=/other is not ddprun's") !=
        std::string::npos);
  const std::string foreign_err = foreign.Err();
  CHECK(std::count(foreign_err.begin(), foreign_err.end(), '\n') == 1);

  // Two ddprund clusters on one etcd, told apart by their prefixes.
  Replica a = StartReplica(h, "a", etcd, {"--etcd_prefix", "/team-a"});
  Replica b = StartReplica(h, "b", etcd, {"--etcd_prefix", "/team-b/"});
  CHECK(WaitLeader({a}, 10) == 0);
  CHECK(WaitLeader({b}, 10) == 0);
  auto leader_a = client->Range("/team-a/leader");
  auto leader_b = client->Range("/team-b/leader");
  REQUIRE(leader_a.ok());
  REQUIRE(leader_b.ok());
  REQUIRE(leader_a->kvs.size() == 1);
  REQUIRE(leader_b->kvs.size() == 1);
  CHECK(leader_a->kvs[0].value == "127.0.0.1:" + std::to_string(a.port));
  CHECK(leader_b->kvs[0].value == "127.0.0.1:" + std::to_string(b.port));
  h.StopDaemon(*a.proc);
  h.StopDaemon(*b.proc);
  // A stopped leader hands over at once: its key is gone.
  auto after = client->Range("/team-a/leader");
  REQUIRE(after.ok());
  CHECK(after->kvs.empty());
}

TEST_CASE(
    "ha: etcd loses its leader, then its majority, mid-job: workers go on, the control "
    "plane waits naming etcd, and serves again when the majority is back",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3);
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd), StartReplica(h, "r1", etcd)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  const std::vector<Proc*> agents =
      StartTwoNodeJob(h, {Endpoints(replicas), Endpoints(replicas)}, "quorum",
                      {{"FIXTURE_PIDFILE_DIR", pids},
                       {"FIXTURE_OUT_DIR", out},
                       {"FIXTURE_SLEEP_MS", "7000"},
                       {"FIXTURE_FAIL_RANK", "0"},
                       {"FIXTURE_FAIL_ONLY_RESTART", "0"},
                       {"FIXTURE_EXIT_CODE", "3"}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, 4, 20);
  // Kill etcd's leader: the others elect one within ~1 s; nothing is lost.
  const int etcd_leader = etcd.Leader();
  REQUIRE(etcd_leader >= 0);
  etcd.Kill(etcd_leader);
  SleepMs(1500);
  for (pid_t w : workers) CHECK(IsAlive(w));
  // Then a second member: no majority. Workers go on.
  const int second = (etcd_leader + 1) % 3;
  etcd.Stop(second);
  SleepMs(3000);
  for (pid_t w : workers) CHECK(IsAlive(w));
  // The majority comes back before rank 0 fails at 7 s; the failure restarts
  // the job once through whichever replica leads then.
  etcd.Restart(etcd_leader);
  etcd.Restart(second);
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 60);
    INFO(a->name << " stderr:\n"
                 << a->Err() << "\nr0:\n"
                 << replicas[0].proc->Err() << "\nr1:\n"
                 << replicas[1].proc->Err());
    CHECK(rc == 0);
  }
  std::set<long> restarts;
  for (const Record& r : ReadRecords(out)) restarts.insert(r.Int("restart_count"));
  CHECK(restarts == std::set<long>{0, 1});
  // Whatever replica lost its lease while etcd had no majority said so in one
  // line naming etcd, and exited; the other serves.
  for (Replica& r : replicas) {
    int status = 0;
    if (::waitpid(r.proc->pid, &status, WNOHANG) == r.proc->pid) {
      r.proc->exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      CHECK(*r.proc->exit == 1);
      CHECK(r.proc->Err().find("etcd") != std::string::npos);
    } else {
      h.StopDaemon(*r.proc);
    }
  }
}

TEST_CASE(
    "ha: etcd with TLS: a replica given the CA (and a client certificate) leads; without "
    "the CA it fails in one line",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  const std::string tls = h.MakeDir("tls");
  // A CA, a server certificate for 127.0.0.1 and a client certificate.
  const std::string gen =
      "cd " + tls +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=ddprun-test-ca 2>/dev/null"
      " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "-subj /CN=127.0.0.1 2>/dev/null"
      " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out server.pem -days 2 -extfile san.ext 2>/dev/null"
      " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "-subj /CN=ddprund 2>/dev/null"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out client.pem -days 2 2>/dev/null";
  REQUIRE(std::system(gen.c_str()) == 0);
  EtcdCluster etcd(h, 1, "etcdtls", tls, /*client_auth=*/true);
  // Right CA and client certificate: leads.
  Replica ok = StartReplica(h, "ok", etcd,
                            {"--etcd_ca", tls + "/ca.pem", "--etcd_cert", tls + "/client.pem",
                             "--etcd_key", tls + "/client.key"});
  CHECK(WaitLeader({ok}, 20) == 0);
  h.StopDaemon(*ok.proc);
  // A second CA, and a client certificate it signed, for the refusals below.
  const std::string gen_other =
      "cd " + tls +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem "
      "-days 2 -subj /CN=other-ca 2>/dev/null"
      " && openssl req -newkey rsa:2048 -nodes -keyout stranger.key -out stranger.csr "
      "-subj /CN=stranger 2>/dev/null"
      " && openssl x509 -req -in stranger.csr -CA other-ca.pem -CAkey other-ca.key "
      "-CAcreateserial -out stranger.pem -days 2 2>/dev/null";
  REQUIRE(std::system(gen_other.c_str()) == 0);
  // Each refusal: exit 1 at start, ONE line naming etcd, its endpoint, the
  // cause and the flags to give (classified by an OpenSSL probe handshake).
  // They run side by side: each waits out one etcd call before the probe.
  struct Refusal {
    std::string name;
    std::vector<std::string> flags;
    std::vector<std::string> says;
  };
  const std::string at = "TLS handshake with etcd at " + etcd.endpoint(0) + " failed: ";
  const std::vector<Refusal> refusals{
      {"plain", {}, {at + "etcd requires TLS and this ddprund connects in plaintext", "--etcd_ca"}},
      {"nocert",
       {"--etcd_ca", tls + "/ca.pem"},
       {at + "etcd requires a client certificate (mutual TLS", "give --etcd_cert and --etcd_key"}},
      {"wrongca",
       {"--etcd_ca", tls + "/other-ca.pem", "--etcd_cert", tls + "/client.pem", "--etcd_key",
        tls + "/client.key"},
       {at + "etcd's certificate is not trusted", "check --etcd_ca"}},
      {"stranger",
       {"--etcd_ca", tls + "/ca.pem", "--etcd_cert", tls + "/stranger.pem", "--etcd_key",
        tls + "/stranger.key"},
       {at + "etcd refused this ddprund's client certificate (mutual TLS", "check --etcd_cert"}},
  };
  std::vector<Proc*> procs;
  for (const Refusal& r : refusals) {
    std::vector<std::string> argv{Ddprund(), "--dashboard_port", "0",
                                  "--host",  "127.0.0.1",        "--port",
                                  "0",       "--etcd_endpoints", etcd.endpoints()};
    argv.insert(argv.end(), r.flags.begin(), r.flags.end());
    procs.push_back(&h.Start(r.name, argv));
  }
  for (std::size_t i = 0; i < refusals.size(); ++i) {
    const int rc = h.Wait(*procs[i], 20);
    const std::string err = procs[i]->Err();
    INFO(refusals[i].name << ": " << err);
    CHECK(rc == 1);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(err.rfind("ddprund: ", 0) == 0);
    for (const std::string& s : refusals[i].says) CHECK(err.find(s) != std::string::npos);
  }
}

// Replicas serving TLS: agents given the CA join through the list and, after
// the leader's kill -9, re-attach to the other replica over TLS too (every
// connection to a replica carries the node's TLS settings).
TEST_CASE("ha: replicas serving TLS: agents join through the list and re-attach after a kill -9",
          "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  if (!HaveOpenssl()) return SkipCase("multiproc", "no openssl command for the test certificates");
  const TestCerts certs = MakeTestCerts();
  REQUIRE(certs.ok);
  Harness h;
  EtcdCluster etcd(h, 1);
  const std::vector<std::string> tls{"--tls_cert", certs.server_cert, "--tls_key",
                                     certs.server_key};
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd, tls), StartReplica(h, "r1", etcd, tls)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const std::string pids = h.PidDir("pids");
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> flags = JobFlags(Endpoints(replicas), "tlsjob", i);
    flags.insert(flags.end() - 1, "--tls_ca=" + certs.ca);  // before the worker command
    agents.push_back(&h.StartDdprun("node" + std::to_string(i), flags,
                                    {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_SLEEP_MS", "5000"}}));
  }
  const std::vector<pid_t> workers = h.WaitForPids(pids, 4, 20);
  REQUIRE(::kill(replicas[leader].proc->pid, SIGKILL) == 0);
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 30);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 0);
    CHECK(a->Err().find("re-attached") != std::string::npos);
  }
  CHECK(ReadPids(pids).size() == 4);  // no restart: the kill touched no worker
  // TTL 2 on an etcd that allows 1: granted as asked, nothing said.
  CHECK(replicas[1 - leader].proc->Err().find("etcd granted") == std::string::npos);
  h.StopDaemon(*replicas[1 - leader].proc);
  RemoveTestCerts(certs);
}

// An etcd with its default timing (election timeout 1000 ms) grants no lease
// under 2 s: a replica asking 1 s says so once, naming the etcd setting, and
// leads with what etcd granted.
TEST_CASE("ha: --etcd_lease_ttl under etcd's minimum: one line naming the TTL granted and the fix",
          "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdPlace defaults;
  defaults.heartbeat_ms = "100";
  defaults.election_timeout_ms = "1000";
  EtcdCluster etcd(h, 1, "etcd", "", false, defaults);
  Replica r;
  r.port =
      h.StartDaemon("r0", &r.proc, {"--etcd_endpoints", etcd.endpoints(), "--etcd_lease_ttl", "1"});
  REQUIRE(WaitLeader({r}, 10) == 0);
  const std::string err = r.proc->Err();
  INFO(err);
  CHECK(err.find("etcd granted a lease TTL of 2 s, not the 1 s of --etcd_lease_ttl") !=
        std::string::npos);
  CHECK(err.find("--election-timeout 500") != std::string::npos);
  h.StopDaemon(*r.proc);
}
