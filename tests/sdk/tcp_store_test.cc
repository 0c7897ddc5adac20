// Which store SDK workers bootstrap through (docs/sdk.md, "Which store"): in a
// single-node job whose rendezvous runs inside ddprun, the round's TCPStore
// (DDPRUN_TCPSTORE_ADDR), so ddprun never loads gRPC for them; with several
// nodes, the gRPC Store. And what the TCPStore's key scope must keep from the
// gRPC Store's token check: a stranger on the host (this test process, a
// TCPStore client without the job's token) reads none of the job's keys and
// changes none, while the job bootstraps next to it. The rank side is
// tests/sdk/worker/sdk_worker.cc ([store-kind], [stranger], [tcpstore-gone]).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "ddprun/rendezvous/store/sdk_store_scope.h"
#include "support/process_helpers.h"

using namespace ddprun::test;
namespace rdzv = ddprun::rendezvous;

namespace {

std::vector<std::string> WorkerJob(std::vector<std::string> flags, const std::string& filter) {
  flags.push_back("--no_python");
  return Concat(std::move(flags), CatchRun(Bin("sdk_worker"), filter));
}

bool WaitForFile(const std::string& path, double timeout_s) {
  const auto t0 = Clock::now();
  while (::access(path.c_str(), F_OK) != 0) {
    if (SecondsSince(t0) > timeout_s) return false;
    SleepMs(10);
  }
  return true;
}

void Touch(const std::string& path) { std::ofstream(path) << "1"; }

constexpr auto kShort = std::chrono::milliseconds(100);

}  // namespace

TEST_CASE("one node: SDK workers use ddprun's TCPStore and ddprun never loads gRPC", "[sdk]") {
  Harness h;
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=2"}, "[store-kind]"),
                          {{"DDP_TIMEOUT_SEC", "30"}, {"SDK_EXPECT_TCPSTORE", "1"}});
  const int rc = h.Wait(p, 120);
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
}

TEST_CASE("two nodes: SDK workers keep the gRPC Store (no DDPRUN_TCPSTORE_ADDR)", "[sdk]") {
  Harness h;
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
  auto node = [&](const std::string& name, const std::string& addr) {
    return &h.StartDdprun(name,
                          WorkerJob({"--nnodes=2", "--nproc_per_node=1", endpoint, "--rdzv_id=kind",
                                     "--local_addr=" + addr},
                                    "[store-kind]"),
                          {{"DDP_TIMEOUT_SEC", "30"},
                           {"SDK_EXPECT_TCPSTORE", "0"},
                           // an outer job's value is never inherited
                           {"DDPRUN_TCPSTORE_ADDR", "127.0.0.1:1"}});
  };
  Proc* a = node("node-a", "127.0.0.1");
  Proc* b = node("node-b", "127.0.0.2");
  const int ra = h.Wait(*a, 120);
  const int rb = h.Wait(*b, 120);
  INFO("node a:\n" << a->Out() << a->Err() << "\nnode b:\n" << b->Out() << b->Err());
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
}

TEST_CASE("a stranger on the job's TCPStore reads none of its keys and changes none", "[sdk]") {
  Harness h;
  const std::string dir = h.dir();
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=2"}, "[stranger]"),
                          {{"DDP_TIMEOUT_SEC", "30"}, {"SDK_STRANGER_DIR", dir}});
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(WaitForFile(dir + "/addr", 60));
  auto hp = rdzv::ParseHostPort(ReadFile(dir + "/addr"));
  REQUIRE(hp.ok());
  // The stranger reaches the store (it is on every interface, as a PyTorch
  // job's MASTER_PORT is) but holds no token.
  auto stranger = rdzv::C10dStoreClient::Connect(hp->host, hp->port, 10.0);
  REQUIRE(stranger.ok());
  rdzv::Store& s = **stranger;

  // Reading: group 0 has bootstrapped (hello, shared-memory keys), and none
  // of its keys is where a client without the token can name it.
  for (const std::string& key :
       std::vector<std::string>{"ddp/pg0/hello/0", "ddp/pg0/shm/id/0", "ddp/pg0/shm/host0/segment",
                                "job", rdzv::SdkStoreJobKey("", 0), rdzv::SdkStoreJobKey("0", 0),
                                rdzv::SdkStoreJobKey("00000000000000000000000000000000", 0)}) {
    INFO(key);
    auto got = s.Get(key, kShort);
    REQUIRE(absl::IsDeadlineExceeded(got.status()));
    auto deleted = s.Delete(key);
    REQUIRE(deleted.ok());
    REQUIRE(!*deleted);
  }
  // Writing: decoys where group 1's bootstrap keys would be without the
  // scope, or in a guessed scope. Had the job read one, its layout, segment or
  // verdict would be the stranger's.
  const std::string wrong_scope = rdzv::SdkStoreScope("not-the-token", 0) + "/";
  std::vector<std::string> decoys;
  for (const std::string& scope : {std::string(), wrong_scope}) {
    for (const char* key :
         {"ddp/pg1/hello/0", "ddp/pg1/hello/1", "ddp/pg1/shm/id/0", "ddp/pg1/shm/id/1",
          "ddp/pg1/shm/host0/segment", "ddp/pg1/shm/ok/0", "ddp/pg1/shm/ok/1"}) {
      decoys.push_back(scope + key);
    }
  }
  for (const std::string& key : decoys) REQUIRE(s.Set(key, "!stranger").ok());
  REQUIRE(s.Add("ddp/pg1/gloo/count", 5).ok());
  Touch(dir + "/planted");

  // Group 1 bootstraps and all-reduces right (the worker checks the sums);
  // the decoys are as the stranger left them: the job wrote none of them.
  REQUIRE(WaitForFile(dir + "/bootstrapped", 60));
  for (const std::string& key : decoys) {
    INFO(key);
    auto got = s.Get(key, kShort);
    REQUIRE(got.ok());
    REQUIRE(*got == "!stranger");
  }
  REQUIRE(absl::IsDeadlineExceeded(s.Get("ddp/pg1/shm/host0/segment/x", kShort).status()));
  Touch(dir + "/checked");
  const int rc = h.Wait(p, 60);
  REQUIRE(rc == 0);
}

TEST_CASE("a worker whose job store is gone gets one line naming DDPRUN_TCPSTORE_ADDR", "[sdk]") {
  Harness h;
  Proc& p = h.StartDdprun("ddprun", WorkerJob({"--nproc_per_node=1"}, "[tcpstore-gone]"),
                          {{"DDP_TIMEOUT_SEC", "1"}});
  const int rc = h.Wait(p, 60);
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
}
