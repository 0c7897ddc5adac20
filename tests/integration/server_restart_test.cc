// ddprund's --state_dir: a server that dies and starts again on the same port
// with the same state directory resumes its jobs, rounds and stores.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/daemon/server.h"

namespace ddprun::rendezvous {
namespace {

using namespace std::chrono_literals;

std::string TempDir() {
  char tmpl[] = "/tmp/ddprun_state_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

ServerOptions Options(const std::string& dir, int port) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.state_dir = dir;
  o.reattach_timeout = 2s;
  return o;
}

JoinSpec Spec(int pid) {
  JoinSpec s;
  s.job_id = "persist";
  s.host = "127.0.0.1";
  s.pid = pid;
  s.nproc = 2;
  s.min_nodes = 2;
  s.max_nodes = 2;
  s.policy.join_timeout_s = 5;
  s.master_port = 5000 + pid;
  s.command = "train";
  return s;
}

Assignment Next(JoinStream& s) {
  RoundEvent e = s.Next(5s);
  if (auto* st = std::get_if<absl::Status>(&e)) FAIL("stream error: " << st->ToString());
  REQUIRE(std::holds_alternative<Assignment>(e));
  return std::get<Assignment>(e);
}

// Starts a server on a fixed port, retrying while the old one's port is released.
std::unique_ptr<RendezvousServer> StartOn(const std::string& dir, int port) {
  for (int i = 0; i < 100; ++i) {
    auto s = RendezvousServer::Start(Options(dir, port));
    if (s.ok()) return std::move(*s);
    std::this_thread::sleep_for(20ms);
  }
  FAIL("cannot restart the server on port " << port);
  return nullptr;
}

TEST_CASE("a restarted server resumes the running round and its store", "[integration]") {
  const std::string dir = TempDir();
  auto server = StartOn(dir, 0);
  const int port = server->port();
  auto c = RendezvousClient::Create("127.0.0.1", port);
  auto s1 = c->Join(Spec(1));
  auto s2 = c->Join(Spec(2));
  Assignment a1 = Next(*s1);
  Assignment a2 = Next(*s2);
  {
    GrpcStore store("127.0.0.1", port, {"persist", a1.store_token, a1.round});
    REQUIRE(store.Set("nccl/unique_id", std::string("\0\1\2id", 5)).ok());
    REQUIRE(*store.Add("counter", 3) == 3);
    REQUIRE(store.Set("gone", "x").ok());
    REQUIRE(*store.Delete("gone"));
  }
  server.reset();  // the daemon dies (its state is on disk)
  CHECK(std::get_if<absl::Status>(&*std::make_unique<RoundEvent>(s1->Next(5s))));

  server = StartOn(dir, port);
  auto status = server->Status();
  REQUIRE(status.size() == 1);
  CHECK(status[0].state == "running");
  CHECK(status[0].world_size == 4);

  // Both agents re-attach and get their assignments back (their streams
  // stay open: a closed one would count as a lost agent).
  std::vector<std::unique_ptr<JoinStream>> streams;
  for (auto [a, pid] : {std::pair{a1, 1}, std::pair{a2, 2}}) {
    JoinSpec rs = Spec(pid);
    rs.resume_round = a.round;
    rs.resume_node_id = a.node_id;
    streams.push_back(c->Join(rs));
    Assignment b = Next(*streams.back());
    CHECK(b.group_rank == a.group_rank);
    CHECK(b.base_rank == a.base_rank);
    CHECK(b.store_token == a.store_token);
    CHECK(b.master_port == a.master_port);
  }
  GrpcStore store("127.0.0.1", port, {"persist", a1.store_token, a1.round});
  CHECK(*store.Get("nccl/unique_id", 1s) == std::string("\0\1\2id", 5));
  CHECK(*store.Add("counter", 1) == 4);
  CHECK(absl::IsDeadlineExceeded(store.Get("gone", 100ms).status()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a restored member that never re-attaches is lost after the timeout", "[integration]") {
  const std::string dir = TempDir();
  auto server = StartOn(dir, 0);
  const int port = server->port();
  auto c = RendezvousClient::Create("127.0.0.1", port);
  auto spec1 = Spec(1), spec2 = Spec(2);
  spec1.min_nodes = spec2.min_nodes = 1;
  auto s1 = c->Join(spec1);
  auto s2 = c->Join(spec2);
  Assignment a1 = Next(*s1);
  Next(*s2);
  server.reset();
  server = StartOn(dir, port);
  JoinSpec rs = spec1;
  rs.resume_round = a1.round;
  rs.resume_node_id = a1.node_id;
  auto again = c->Join(rs);
  Next(*again);
  // Agent 2 never comes back: after 2 s the survivor is told to re-form.
  RoundEvent e = again->Next(6s);
  REQUIRE(std::holds_alternative<RestartRound>(e));
  CHECK(std::get<RestartRound>(e).next_round == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a corrupt state file is refused with a clear message", "[integration]") {
  const std::string dir = TempDir();
  {
    auto server = StartOn(dir, 0);
    auto c = RendezvousClient::Create("127.0.0.1", server->port());
    auto s1 = c->Join(Spec(1));
    auto s2 = c->Join(Spec(2));
    Next(*s1);
    Next(*s2);
  }
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/jobs")) file = e.path();
  REQUIRE_FALSE(file.empty());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("\xff\xff\xff", 3);
  }
  auto s = RendezvousServer::Start(Options(dir, 0));
  REQUIRE_FALSE(s.ok());
  CHECK(absl::IsDataLoss(s.status()));
  CHECK_THAT(std::string(s.status().message()), Catch::Contains("is corrupt"));
  CHECK_THAT(std::string(s.status().message()), Catch::Contains(file));
  // A record cut short at the end (a crash mid-append) is only a warning.
  std::filesystem::remove(file);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an unwritable state directory is refused", "[integration]") {
  auto s = RendezvousServer::Start(Options("/proc/ddprun-no-such-dir", 0));
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.status().message()), Catch::Contains("--state_dir"));
}

}  // namespace
}  // namespace ddprun::rendezvous
