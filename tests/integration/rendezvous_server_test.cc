// A real gRPC rendezvous server on 127.0.0.1, port 0: joins, rounds, store
// semantics (including wait timeouts), tokens and bad requests.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/daemon/server.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<RendezvousServer> StartServer() {
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto s = RendezvousServer::Start(opts);
  REQUIRE(s.ok());
  REQUIRE((*s)->port() > 0);
  return std::move(*s);
}

JoinSpec Spec(const std::string& job, int pid, int nodes = 2) {
  JoinSpec s;
  s.job_id = job;
  s.host = "127.0.0.1";
  s.pid = pid;
  s.nproc = 2;
  s.min_nodes = nodes;
  s.max_nodes = nodes;
  s.policy.join_timeout_s = 5;
  s.policy.last_call_timeout_s = 0.1;
  s.master_port = 4000 + pid;
  s.command = "train";
  return s;
}

// Joins are asynchronous: wait until the server has seen n members of job.
void WaitForMembers(RendezvousServer& server, const std::string& job, std::size_t n) {
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& j : server.Status())
      if (j.job_id == job && j.nodes.size() >= n) return;
    std::this_thread::sleep_for(1ms);
  }
  FAIL("job " << job << " never had " << n << " members");
}

Assignment NextAssignment(JoinStream& stream) {
  RoundEvent e = stream.Next(5s);
  if (auto* st = std::get_if<absl::Status>(&e)) FAIL("stream error: " << st->ToString());
  REQUIRE(std::holds_alternative<Assignment>(e));
  return std::get<Assignment>(e);
}

TEST_CASE("two agents join a round over gRPC and get consistent ranks", "[integration]") {
  auto server = StartServer();
  auto c1 = RendezvousClient::Create("127.0.0.1", server->port());
  auto c2 = RendezvousClient::Create("127.0.0.1", server->port());
  REQUIRE(c1->WaitForConnected(5s).ok());
  auto s1 = c1->Join(Spec("job-a", 11));
  WaitForMembers(*server, "job-a", 1);
  auto s2 = c2->Join(Spec("job-a", 12));
  Assignment a1 = NextAssignment(*s1);
  Assignment a2 = NextAssignment(*s2);
  CHECK(a1.group_rank == 0);
  CHECK(a2.group_rank == 1);
  CHECK(a1.world_size == 4);
  CHECK(a2.base_rank == 2);
  CHECK(a1.master_port == 4011);
  CHECK(a1.store_token == a2.store_token);

  auto st = server->Status();
  REQUIRE(st.size() == 1);
  CHECK(st[0].state == "running");
  CHECK(st[0].world_size == 4);

  SECTION("store: set/get/add/compare-set/delete/multi-get, and a wait that times out") {
    GrpcStore store("127.0.0.1", server->port(), {"job-a", a1.store_token, a1.round});
    REQUIRE(store.Set("k", "v").ok());
    CHECK(*store.Get("k", 1s) == "v");
    CHECK(*store.Add("n", 5) == 5);
    CHECK(*store.Add("n", -2) == 3);
    std::string cur;
    CHECK_FALSE(*store.CompareSet("k", std::string("x"), "y", &cur));
    CHECK(cur == "v");
    CHECK(*store.CompareSet("k", std::string("v"), "y", &cur));
    CHECK(*store.CompareSet("new", std::nullopt, "z", &cur));
    CHECK(*store.MultiGet({"k", "new"}, 1s) == std::vector<std::string>{"y", "z"});
    CHECK(*store.Delete("k"));
    CHECK_FALSE(*store.Delete("k"));
    auto t0 = std::chrono::steady_clock::now();
    auto missing = store.Get("never", 200ms);
    auto dt = std::chrono::steady_clock::now() - t0;
    CHECK(absl::IsDeadlineExceeded(missing.status()));
    // The server's own answer (not the client's deadline) crosses gRPC as is.
    CHECK_THAT(std::string(missing.status().message()), Catch::Contains("store wait timed out"));
    CHECK(dt >= 190ms);
    CHECK(dt < 3s);
    // A waiter is woken by a later set from another client.
    std::thread setter([&] {
      std::this_thread::sleep_for(100ms);
      GrpcStore other("127.0.0.1", server->port(), {"job-a", a2.store_token, a2.round});
      REQUIRE(other.Set("late", "here").ok());
    });
    CHECK(*store.Get("late", 5s) == "here");
    setter.join();
    CHECK(store.Wait({"late", "new"}, 1s).ok());
  }

  SECTION("store: wrong token, no token, another job, stale round, oversized value") {
    GrpcStore bad("127.0.0.1", server->port(), {"job-a", "not-the-token", a1.round});
    CHECK(absl::IsPermissionDenied(bad.Set("k", "v")));
    GrpcStore none("127.0.0.1", server->port(), {"job-a", "", a1.round});
    CHECK(absl::IsUnauthenticated(none.Set("k", "v")));
    GrpcStore other("127.0.0.1", server->port(), {"job-b", a1.store_token, 0});
    CHECK(absl::IsPermissionDenied(other.Set("k", "v")));
    GrpcStore stale("127.0.0.1", server->port(), {"job-a", a1.store_token, a1.round + 7});
    auto st = stale.Set("k", "v");
    CHECK(absl::IsFailedPrecondition(st));
    CHECK_THAT(std::string(st.message()), Catch::Contains("stale round"));
    GrpcStore good("127.0.0.1", server->port(), {"job-a", a1.store_token, a1.round});
    auto big = good.Set("big", std::string(2 << 20, 'x'));
    CHECK_FALSE(big.ok());
    CHECK_THAT(std::string(big.message()), Catch::Contains("limit"));
    CHECK(good.Set("small", "ok").ok());  // the server is fine afterwards
  }

  SECTION("a failure report restarts both agents into round 1 with one counter") {
    // max_restarts is 0 in Spec: the job closes for everyone.
    REQUIRE(c2->Report("job-a", a2.node_id, a2.round, Outcome::kFailed, {[] {
                         WorkerFailure f;
                         f.host = "127.0.0.1";
                         f.global_rank = 3;
                         f.local_rank = 1;
                         f.exit_code = 7;
                         return f;
                       }()},
                       5s)
                .ok());
    for (auto* s : {s1.get(), s2.get()}) {
      RoundEvent e = s->Next(5s);
      REQUIRE(std::holds_alternative<JobClosed>(e));
      auto& c = std::get<JobClosed>(e);
      CHECK_FALSE(c.success);
      REQUIRE(c.failures.size() == 1);
      CHECK(c.failures[0].global_rank == 3);
      CHECK(c.failures[0].exit_code == 7);
    }
  }

  SECTION("an agent whose stream breaks is noticed; the survivor re-joins") {
    s2->Cancel();
    RoundEvent e = s1->Next(5s);
    REQUIRE(std::holds_alternative<RestartRound>(e));
    CHECK(std::get<RestartRound>(e).next_round == 1);
  }
}

TEST_CASE("a node that asks for another policy joins, and its assignment names the job's",
          "[integration]") {
  auto server = StartServer();
  auto c1 = RendezvousClient::Create("127.0.0.1", server->port());
  auto c2 = RendezvousClient::Create("127.0.0.1", server->port());
  REQUIRE(c1->WaitForConnected(5s).ok());
  JoinSpec first = Spec("job-p", 11);
  first.policy.on_hang = OnHang::kRestart;
  auto s1 = c1->Join(first);
  WaitForMembers(*server, "job-p", 1);
  JoinSpec second = Spec("job-p", 12);
  second.policy.hang_timeout_s = 60;
  second.policy.ckpt_replicas = 1;
  auto s2 = c2->Join(second);
  Assignment a1 = NextAssignment(*s1);
  Assignment a2 = NextAssignment(*s2);
  // The first joiner's policy holds for the job, and crosses the wire whole.
  REQUIRE(a1.policy.has_value());
  REQUIRE(a2.policy.has_value());
  CHECK(*a1.policy == first.policy);
  CHECK(*a2.policy == first.policy);
  // What the second node's agent prints (Agent: PolicyWarning, once).
  CHECK(PolicyWarning("this node", second.policy, *a2.policy) ==
        "this node asked hang_timeout=60s, on_hang=report, ckpt_replicas=1, the job runs with "
        "300s, restart, 0 (the first node's); pass the same --hang_timeout and --on_hang and "
        "--ckpt_replicas on every node");
  CHECK(PolicyWarning("this node", first.policy, *a1.policy).empty());
}

TEST_CASE("restart within budget: both agents get the next round", "[integration]") {
  auto server = StartServer();
  auto c = RendezvousClient::Create("127.0.0.1", server->port());
  auto spec1 = Spec("job-r", 1);
  auto spec2 = Spec("job-r", 2);
  spec1.policy.max_restarts = spec2.policy.max_restarts = 2;
  auto s1 = c->Join(spec1);
  auto s2 = c->Join(spec2);
  Assignment a1 = NextAssignment(*s1);
  NextAssignment(*s2);
  REQUIRE(c->Report("job-r", a1.node_id, 0, Outcome::kFailed, {}, 5s).ok());
  for (auto* s : {s1.get(), s2.get()}) {
    RoundEvent e = s->Next(5s);
    REQUIRE(std::holds_alternative<RestartRound>(e));
    CHECK(std::get<RestartRound>(e).counts_as_failure);
  }
  auto r1 = c->Join(spec1);
  auto r2 = c->Join(spec2);
  Assignment b1 = NextAssignment(*r1);
  Assignment b2 = NextAssignment(*r2);
  CHECK(b1.round == 1);
  CHECK(b1.restart_count == 1);
  CHECK(b2.restart_count == 1);
  // A stale agent reporting for round 0 is refused.
  auto stale = c->Report("job-r", a1.node_id, 0, Outcome::kFailed, {}, 5s);
  CHECK(absl::IsFailedPrecondition(stale));
}

TEST_CASE("join: a taken node rank falls back to arrival order; timeout; other jobs undisturbed",
          "[integration]") {
  auto server = StartServer();
  auto c = RendezvousClient::Create("127.0.0.1", server->port());
  auto a = Spec("job-x", 1);
  a.requested_rank = 0;
  auto b = Spec("job-x", 2);
  b.requested_rank = 0;  // the same constant on every node, as torchrun scripts pass
  auto sa = c->Join(a);
  WaitForMembers(*server, "job-x", 1);

  auto lonely = Spec("job-y", 3);
  lonely.policy.join_timeout_s = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  auto sl = c->Join(lonely);
  RoundEvent t = sl->Next(5s);
  REQUIRE(std::holds_alternative<absl::Status>(t));
  CHECK(absl::IsDeadlineExceeded(std::get<absl::Status>(t)));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);

  // job-x, still gathering, completes with the second node in the next seat.
  auto sb = c->Join(b);
  CHECK(NextAssignment(*sa).group_rank == 0);
  CHECK(NextAssignment(*sb).group_rank == 1);
}

TEST_CASE("malformed join requests are refused one by one", "[integration]") {
  auto server = StartServer();
  auto c = RendezvousClient::Create("127.0.0.1", server->port());
  auto check_refused = [&](JoinSpec s) {
    auto stream = c->Join(s);
    RoundEvent e = stream->Next(5s);
    REQUIRE(std::holds_alternative<absl::Status>(e));
    CHECK(absl::IsInvalidArgument(std::get<absl::Status>(e)));
  };
  auto s = Spec("", 1);
  check_refused(s);
  s = Spec("j", 1);
  s.nproc = 0;
  check_refused(s);
  s = Spec("j", 1);
  s.min_nodes = 3;
  check_refused(s);
  s = Spec("j", 1);
  s.protocol_version = 99;
  check_refused(s);
  s = Spec("j", 1);
  s.policy.join_timeout_s = -1;
  check_refused(s);
  // Raw garbage on the port does not hurt the server.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(server->port()));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n\x01\x02\x03";
  CHECK(write(fd, junk, sizeof(junk)) > 0);
  close(fd);
  auto ok = c->Status("", 2s);
  CHECK(ok.ok());
}

TEST_CASE("error kinds cross gRPC: a closed job, a bad job id, a server shutting down",
          "[integration]") {
  auto server = StartServer();
  auto c = RendezvousClient::Create("127.0.0.1", server->port());
  auto s1 = c->Join(Spec("job-c", 1));
  auto s2 = c->Join(Spec("job-c", 2));
  Assignment a1 = NextAssignment(*s1);
  Assignment a2 = NextAssignment(*s2);
  REQUIRE(c->Report("job-c", a1.node_id, a1.round, Outcome::kSucceeded, {}, 5s).ok());
  REQUIRE(c->Report("job-c", a2.node_id, a2.round, Outcome::kSucceeded, {}, 5s).ok());
  REQUIRE(std::holds_alternative<JobClosed>(s1->Next(5s)));

  // The server's ClosedError is a Closed kind on the client, not just a
  // FailedPrecondition (which a stale round also is).
  auto late = c->Join(Spec("job-c", 3));
  RoundEvent e = late->Next(5s);
  REQUIRE(std::holds_alternative<absl::Status>(e));
  const absl::Status& closed = std::get<absl::Status>(e);
  CHECK(KindOf(closed) == ErrorKind::kClosed);
  CHECK_THAT(std::string(closed.message()), Catch::Contains("the job is closed"));

  // The one job-id rule, one fenced line.
  auto spaced = c->Join(Spec("a b", 4));
  RoundEvent bad = spaced->Next(5s);
  REQUIRE(std::holds_alternative<absl::Status>(bad));
  const std::string msg(std::get<absl::Status>(bad).message());
  CHECK(KindOf(std::get<absl::Status>(bad)) == ErrorKind::kBadInput);
  CHECK_THAT(msg, Catch::StartsWith("[job a b round -1] the job id 'a b' contains a space"));
  CHECK(msg.find('\n') == std::string::npos);

  // A stream open when the server stops hears the server's reason (a
  // Connection kind), not a broken connection.
  auto waiting = c->Join(Spec("job-w", 5));
  WaitForMembers(*server, "job-w", 1);
  server->Shutdown();
  RoundEvent down = waiting->Next(5s);
  REQUIRE(std::holds_alternative<absl::Status>(down));
  CHECK(KindOf(std::get<absl::Status>(down)) == ErrorKind::kConnection);
  CHECK_THAT(std::string(std::get<absl::Status>(down).message()),
             Catch::Contains("[job job-w round 0] the rendezvous server is shutting down"));
}

TEST_CASE("a port in use is a clear error", "[integration]") {
  auto server = StartServer();
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = server->port();
  auto second = RendezvousServer::Start(opts);
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(second.status().message()), Catch::Contains("address already in use"));
  // The caller's fix ends the line.
  opts.listen_fix = "pick another --port";
  auto third = RendezvousServer::Start(opts);
  REQUIRE_FALSE(third.ok());
  CHECK_THAT(std::string(third.status().message()), Catch::EndsWith("; pick another --port"));
}

TEST_CASE("unreachable endpoint fails within the timeout", "[integration]") {
  int port;
  {
    auto server = StartServer();
    port = server->port();
  }
  auto c = RendezvousClient::Create("127.0.0.1", port);
  auto t0 = std::chrono::steady_clock::now();
  auto st = c->WaitForConnected(300ms);
  CHECK(absl::IsUnavailable(st));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK_THAT(std::string(st.message()), Catch::Contains("cannot reach the rendezvous"));
}

}  // namespace
}  // namespace ddprun::rendezvous
