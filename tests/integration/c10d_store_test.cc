// Integration tests of C10dStoreServer on port 0: our C10dStoreClient (torch
// 2.x dialect), raw sockets speaking both dialects, PyTorch 1.13's own
// TCPStore client and a 2-process gloo init_process_group(env://) through it,
// misbehaving clients, port conflicts and prompt shutdown.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "ddprun/rendezvous/store/c10d_wire.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "support/c10d_msg.h"
#include "support/skip.h"

namespace ddprun::rendezvous {
namespace {

using ddprun::test::SkipCase;
using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

std::unique_ptr<C10dStoreServer> StartServer() {
  auto server = C10dStoreServer::Start(C10dStoreServerOptions{"127.0.0.1", 0});
  REQUIRE(server.ok());
  REQUIRE((*server)->port() > 0);
  return *std::move(server);
}

// ---------------------------------------------------------------------------
// A raw client socket with bounded reads, for speaking the wire protocol by hand.

class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConn() { ::close(fd_); }

  void Send(const std::string& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  // Reads exactly n bytes (fails the test after 10 s).
  std::string Recv(std::size_t n) {
    std::string out(n, '\0');
    std::size_t off = 0;
    while (off < n) {
      ssize_t got = ::recv(fd_, out.data() + off, n - off, 0);
      REQUIRE(got > 0);
      off += got;
    }
    return out;
  }
  std::uint8_t RecvU8() { return static_cast<std::uint8_t>(Recv(1)[0]); }
  std::int64_t RecvI64() {
    std::int64_t v;
    std::memcpy(&v, Recv(8).data(), 8);
    return v;
  }
  std::uint32_t RecvU32() {
    std::uint32_t v;
    std::memcpy(&v, Recv(4).data(), 4);
    return v;
  }
  std::string RecvString() {
    std::uint64_t n;
    std::memcpy(&n, Recv(8).data(), 8);
    REQUIRE(n <= kMaxValueBytes);
    return Recv(n);
  }
  // True if nothing arrives within `wait` (and the connection is still open).
  bool Silent(milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(wait.count())) == 0;
  }
  // True if the server closes the connection within `wait`.
  bool ClosedByServer(milliseconds wait) {
    const auto deadline = SteadyClock::now() + wait;
    char buf[256];
    while (SteadyClock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
      if (got == 0) return true;
      if (got < 0 && errno != EAGAIN && errno != EINTR) return true;  // reset
    }
    return false;
  }

 private:
  int fd_ = -1;
};

using ::ddprun::test::Msg;

// Query types of the two dialects, written out by hand (c10d_wire.h has the codec).
namespace modern {
constexpr std::uint8_t kValidate = 0, kSet = 1, kCompareSet = 2, kGet = 3, kAdd = 4, kCheck = 5,
                       kWait = 6, kGetNumKeys = 7, kDeleteKey = 8, kAppend = 9, kMultiGet = 10,
                       kMultiSet = 11, kCancelWait = 12, kPing = 13, kQueuePush = 14,
                       kQueuePop = 15, kQueueLen = 16, kListKeys = 17;
}  // namespace modern
namespace legacy {
constexpr std::uint8_t kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5,
                       kGetNumKeys = 6, kWatchKey = 7, kDeleteKey = 8, kAppend = 9, kMultiGet = 10,
                       kMultiSet = 11, kCancelWait = 12;
}  // namespace legacy
constexpr std::uint32_t kMagic = 0x3C85F7CE;
static_assert(kMagic == c10d::kValidationMagic);

// ---------------------------------------------------------------------------
// Running python.

struct CmdResult {
  int exit_code = -1;
  std::string output;
};

std::string ReadAll(FILE* f) {
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// Runs a shell command (always under `timeout`, which kills it on expiry).
CmdResult Run(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  CmdResult r;
  r.output = ReadAll(p);
  r.exit_code = ExitCode(::pclose(p));
  return r;
}

constexpr const char* kPython = "/usr/bin/python3";

bool TorchAvailable() {
  static const bool available =
      Run(std::string("timeout -k 5 60 ") + kPython + " -c 'import torch.distributed' 2>&1")
          .exit_code == 0;
  return available;
}

std::string WriteScript(const std::string& name, const std::string& body) {
  const std::string path =
      "/tmp/ddprun_c10d_test_" + std::to_string(::getpid()) + "_" + name + ".py";
  std::ofstream(path) << body;
  return path;
}

// ---------------------------------------------------------------------------
// (a) our client

TEST_CASE("C10dStoreClient set, get and add through the server", "[integration]") {
  auto server = StartServer();
  auto client = C10dStoreClient::Connect("127.0.0.1", server->port(), 5.0);
  REQUIRE(client.ok());

  REQUIRE((*client)->Set("key", "value").ok());
  auto v = (*client)->Get("key", 5.0);
  REQUIRE(v.ok());
  CHECK(*v == "value");
  CHECK(server->engine().Get("key") == std::optional<std::string>("value"));

  auto n = (*client)->Add("counter", 3);
  REQUIRE(n.ok());
  CHECK(*n == 3);
  n = (*client)->Add("counter", -10);
  REQUIRE(n.ok());
  CHECK(*n == -7);
  CHECK(server->engine().Get("counter") == std::optional<std::string>("-7"));

  // Binary values survive.
  const std::string binary("\0\x01\xff zero", 7);
  REQUIRE((*client)->Set("bin", binary).ok());
  CHECK(*(*client)->Get("bin", 5.0) == binary);

  // The agent publishes through the engine; clients see it.
  REQUIRE(server->engine().Set("from-agent", "hello").ok());
  CHECK(*(*client)->Get("from-agent", 5.0) == "hello");

  CHECK(absl::IsInvalidArgument((*client)->Set("big", std::string(kMaxValueBytes + 1, 'x'))));
}

TEST_CASE("C10dStoreClient is a Store: compare-set, wait, delete, multi-get", "[integration]") {
  auto server = StartServer();
  auto connected = C10dStoreClient::Connect("127.0.0.1", server->port(), seconds(5));
  REQUIRE(connected.ok());
  std::unique_ptr<Store> store = *std::move(connected);

  std::string current;
  auto swapped = store->CompareSet("cas", std::nullopt, "first", &current);
  REQUIRE(swapped.ok());
  CHECK(*swapped);
  CHECK(current == "first");
  swapped = store->CompareSet("cas", std::string("wrong"), "second", &current);
  REQUIRE(swapped.ok());
  CHECK_FALSE(*swapped);
  CHECK(current == "first");
  swapped = store->CompareSet("cas", std::string("first"), "second", &current);
  REQUIRE(swapped.ok());
  CHECK(*swapped);
  CHECK(server->engine().Get("cas") == std::optional<std::string>("second"));

  REQUIRE(store->Set("a", "1").ok());
  REQUIRE(store->Set("b", "2").ok());
  CHECK(store->Wait({"a", "b"}, milliseconds(500)).ok());
  const auto start = SteadyClock::now();
  absl::Status missing = store->Wait({"a", "nope"}, milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(missing));
  CHECK(missing.message().find("store keys 'a', 'nope'") != std::string::npos);
  CHECK(SteadyClock::now() - start < seconds(5));
  CHECK(server->engine().NumWaiters() == 0);

  auto values = store->MultiGet({"a", "b", "cas"}, milliseconds(500));
  REQUIRE(values.ok());
  CHECK(*values == std::vector<std::string>{"1", "2", "second"});
  CHECK(absl::IsDeadlineExceeded(store->MultiGet({"a", "nope"}, milliseconds(50)).status()));

  auto deleted = store->Delete("a");
  REQUIRE(deleted.ok());
  CHECK(*deleted);
  deleted = store->Delete("a");
  REQUIRE(deleted.ok());
  CHECK_FALSE(*deleted);
  CHECK_FALSE(server->engine().Get("a").has_value());
  CHECK(*store->Get("b", milliseconds(500)) == "2");
  CHECK(absl::IsInvalidArgument(
      store->Get(std::string(kMaxKeyBytes + 1, 'k'), milliseconds(1)).status()));
}

TEST_CASE("C10dStoreClient Get waits for a key another client sets later", "[integration]") {
  auto server = StartServer();
  auto waiter = C10dStoreClient::Connect("127.0.0.1", server->port(), 5.0);
  REQUIRE(waiter.ok());
  // Catch2 assertions are not thread-safe: threads record, the test asserts.
  absl::Status set_status;
  std::thread setter([&set_status, port = server->port()] {
    std::this_thread::sleep_for(milliseconds(200));
    auto other = C10dStoreClient::Connect("127.0.0.1", port, 5.0);
    set_status = other.ok() ? (*other)->Set("late", "arrived") : other.status();
  });
  const auto start = SteadyClock::now();
  auto v = (*waiter)->Get("late", 20.0);
  const auto elapsed = SteadyClock::now() - start;
  setter.join();
  REQUIRE(set_status.ok());
  REQUIRE(v.ok());
  CHECK(*v == "arrived");
  CHECK(elapsed >= milliseconds(150));
  CHECK(elapsed < seconds(10));
}

TEST_CASE("C10dStoreClient Get times out, cancels the wait and stays usable", "[integration]") {
  auto server = StartServer();
  auto client = C10dStoreClient::Connect("127.0.0.1", server->port(), 5.0);
  REQUIRE(client.ok());
  const auto start = SteadyClock::now();
  auto v = (*client)->Get("never", 0.1);
  CHECK(absl::IsDeadlineExceeded(v.status()));
  CHECK(v.status().message().find("'never'") != std::string::npos);
  CHECK(SteadyClock::now() - start < seconds(5));
  // The cancelled wait left no stray STOP_WAITING behind.
  REQUIRE(server->engine().Set("never", "now").ok());
  REQUIRE((*client)->Set("k", "v").ok());
  CHECK(*(*client)->Get("k", 5.0) == "v");
  CHECK(*(*client)->Get("never", 5.0) == "now");
  CHECK(server->engine().NumWaiters() == 0);
}

TEST_CASE("C10dStoreClient Connect retries until the server is up, then times out",
          "[integration]") {
  // Find a free port, release it, and start the server on it a bit later.
  int port = 0;
  {
    auto probe = StartServer();
    port = probe->port();
  }
  absl::StatusOr<std::unique_ptr<C10dStoreServer>> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    late = C10dStoreServer::Start(C10dStoreServerOptions{"127.0.0.1", port});
  });
  auto client = C10dStoreClient::Connect("127.0.0.1", port, 10.0);
  starter.join();
  REQUIRE(late.ok());
  REQUIRE(client.ok());
  REQUIRE((*client)->Set("a", "b").ok());
  CHECK(*(*client)->Get("a", 5.0) == "b");
  late->reset();

  const auto start = SteadyClock::now();
  auto none = C10dStoreClient::Connect("127.0.0.1", port, 0.3);
  CHECK(absl::IsUnavailable(none.status()));
  CHECK(none.status().message().find("cannot connect to the TCPStore at 127.0.0.1:") !=
        std::string::npos);
  CHECK(SteadyClock::now() - start < seconds(5));
}

// ---------------------------------------------------------------------------
// Both dialects by hand

TEST_CASE("C10dStoreServer speaks the torch 2.x dialect", "[integration]") {
  auto server = StartServer();
  RawConn c(server->port());
  c.Send(Msg(modern::kValidate).U32(kMagic));
  c.Send(Msg(modern::kPing).U32(12345));
  CHECK(c.RecvU32() == 12345);

  c.Send(Msg(modern::kSet).Str("/a").Str("1"));
  c.Send(Msg(modern::kGet).Str("/a"));
  CHECK(c.RecvString() == "1");

  c.Send(Msg(modern::kAdd).Str("/n").I64(5));
  CHECK(c.RecvI64() == 5);

  // COMPARE_SET: empty expected on a missing key sets it; a mismatch returns the
  // current value; a missing key with a non-empty expected returns expected.
  c.Send(Msg(modern::kCompareSet).Str("/cas").Str("").Str("first"));
  CHECK(c.RecvString() == "first");
  c.Send(Msg(modern::kCompareSet).Str("/cas").Str("wrong").Str("second"));
  CHECK(c.RecvString() == "first");
  c.Send(Msg(modern::kCompareSet).Str("/cas").Str("first").Str("second"));
  CHECK(c.RecvString() == "second");
  c.Send(Msg(modern::kCompareSet).Str("/missing").Str("x").Str("y"));
  CHECK(c.RecvString() == "x");
  CHECK_FALSE(server->engine().Get("/missing").has_value());

  c.Send(Msg(modern::kCheck).U64(2).Str("/a").Str("/n"));
  CHECK(c.RecvU8() == 0);  // READY
  c.Send(Msg(modern::kCheck).U64(2).Str("/a").Str("/nope"));
  CHECK(c.RecvU8() == 1);  // NOT_READY

  c.Send(Msg(modern::kGetNumKeys));
  CHECK(c.RecvI64() == 3);

  c.Send(Msg(modern::kAppend).Str("/log").Str("ab"));
  c.Send(Msg(modern::kAppend).Str("/log").Str("cd"));
  c.Send(Msg(modern::kMultiSet).U64(2).Str("/m1").Str("x").Str("/m2").Str("y"));
  c.Send(Msg(modern::kMultiGet).U64(3).Str("/log").Str("/m1").Str("/m2"));
  CHECK(c.RecvString() == "abcd");
  CHECK(c.RecvString() == "x");
  CHECK(c.RecvString() == "y");

  c.Send(Msg(modern::kDeleteKey).Str("/m1"));
  CHECK(c.RecvI64() == 1);
  c.Send(Msg(modern::kDeleteKey).Str("/m1"));
  CHECK(c.RecvI64() == 0);

  // WAIT on a present key answers at once; on a missing one when it is set.
  c.Send(Msg(modern::kWait).U64(1).Str("/a"));
  CHECK(c.RecvU8() == 0);  // STOP_WAITING
  c.Send(Msg(modern::kWait).U64(2).Str("/a").Str("/later"));
  CHECK(c.Silent(milliseconds(100)));
  RawConn other(server->port());
  other.Send(Msg(modern::kValidate).U32(kMagic));
  other.Send(Msg(modern::kSet).Str("/later").Str("z"));
  CHECK(c.RecvU8() == 0);

  // CANCEL_WAIT answers WAIT_CANCELED and the wait never fires afterwards.
  c.Send(Msg(modern::kWait).U64(1).Str("/cancelled"));
  CHECK(c.Silent(milliseconds(50)));
  c.Send(Msg(modern::kCancelWait));
  CHECK(c.RecvU8() == 1);  // WAIT_CANCELED
  REQUIRE(server->engine().Set("/cancelled", "1").ok());
  CHECK(c.Silent(milliseconds(100)));
  CHECK(server->engine().NumWaiters() == 0);

  // Queues (torch 2.8+): a blocking pop is WAIT then QUEUE_POP; a push from
  // another connection wakes it.
  c.Send(Msg(modern::kWait).U64(1).Str("/q"));
  CHECK(c.Silent(milliseconds(50)));
  other.Send(Msg(modern::kQueuePush).Str("/q").Str("v"));
  CHECK(c.RecvU8() == 0);  // STOP_WAITING
  c.Send(Msg(modern::kQueueLen).Str("/q"));
  CHECK(c.RecvI64() == 1);
  c.Send(Msg(modern::kQueuePop).Str("/q"));
  CHECK(c.RecvI64() == 1);
  CHECK(c.RecvString() == "v");
  c.Send(Msg(modern::kQueuePop).Str("/q"));
  CHECK(c.RecvI64() == 0);  // empty: nothing follows
  c.Send(Msg(modern::kListKeys));
  const std::int64_t listed = c.RecvI64();
  REQUIRE(listed == 7);  // the keys, not the queue /q
  std::set<std::string> keys;
  for (std::int64_t i = 0; i < listed; ++i) keys.insert(c.RecvString());
  CHECK(keys == std::set<std::string>{"/a", "/n", "/cas", "/log", "/m2", "/later", "/cancelled"});

  // Unsupported queries close the connection with a log line, nothing else.
  c.Send(Msg(18));
  CHECK(c.ClosedByServer(seconds(5)));
}

TEST_CASE("C10dStoreServer speaks the torch 1.13 dialect", "[integration]") {
  auto server = StartServer();
  RawConn c(server->port());
  // torch 1.13 also opens an idle callback connection; it must not disturb anything.
  RawConn idle(server->port());

  c.Send(Msg(legacy::kSet).Str("/a").Str("1"));  // first byte 0, not followed by the magic
  c.Send(Msg(legacy::kGet).Str("/a"));
  CHECK(c.RecvString() == "1");
  c.Send(Msg(legacy::kAdd).Str("/n").I64(2));
  CHECK(c.RecvI64() == 2);
  c.Send(Msg(legacy::kCompareSet).Str("/cas").Str("").Str("v"));
  CHECK(c.RecvString() == "v");
  c.Send(Msg(legacy::kCheck).U64(1).Str("/cas"));
  CHECK(c.RecvU8() == 0);
  c.Send(Msg(legacy::kGetNumKeys));
  CHECK(c.RecvI64() == 3);
  c.Send(Msg(legacy::kDeleteKey).Str("/cas"));
  CHECK(c.RecvI64() == 1);
  c.Send(Msg(legacy::kAppend).Str("/log").Str("x"));
  c.Send(Msg(legacy::kMultiSet).U64(1).Str("/m").Str("y"));
  c.Send(Msg(legacy::kMultiGet).U64(2).Str("/log").Str("/m"));
  CHECK(c.RecvString() == "x");
  CHECK(c.RecvString() == "y");
  c.Send(Msg(legacy::kWait).U64(1).Str("/w"));
  CHECK(c.Silent(milliseconds(50)));
  c.Send(Msg(legacy::kCancelWait));
  CHECK(c.RecvU8() == 1);
  c.Send(Msg(legacy::kWait).U64(1).Str("/w"));
  REQUIRE(server->engine().Set("/w", "1").ok());
  CHECK(c.RecvU8() == 0);

  CHECK(idle.Silent(milliseconds(50)));
  // A connection whose first byte is non-zero is legacy: 3 is ADD.
  RawConn add_first(server->port());
  add_first.Send(Msg(legacy::kAdd).Str("init/").I64(1));
  CHECK(add_first.RecvI64() == 1);

  // watch_key is not supported: that connection (only) is closed.
  idle.Send(Msg(legacy::kWatchKey).Str("/a"));
  CHECK(idle.ClosedByServer(seconds(5)));
  c.Send(Msg(legacy::kGet).Str("/a"));
  CHECK(c.RecvString() == "1");
}

// ---------------------------------------------------------------------------
// (b) PyTorch 1.13's TCPStore client

TEST_CASE("torch TCPStore client works against C10dStoreServer", "[integration][torch]") {
  if (!TorchAvailable()) {
    return SkipCase("integration", "/usr/bin/python3 cannot import torch.distributed");
  }
  auto server = StartServer();
  const std::string script = WriteScript("tcpstore", R"PY(
import sys, datetime
import torch
import torch.distributed as dist
host, port = sys.argv[1], int(sys.argv[2])
s = dist.TCPStore(host, port, 1, False, datetime.timedelta(seconds=10))
s.set("k", "v")
assert s.get("k") == b"v", s.get("k")
assert s.add("n", 5) == 5
assert s.add("n", 2) == 7
assert s.get("n") == b"7"
assert s.compare_set("cas", "", "first") == b"first"
assert s.compare_set("cas", "wrong", "second") == b"first"
assert s.compare_set("cas", "first", "second") == b"second"
assert s.compare_set("missing", "x", "y") == b"x"
s.wait(["k", "n"])
s.wait(["k"], datetime.timedelta(seconds=5))
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    raise AssertionError("wait on a missing key returned")
except RuntimeError as e:
    print("wait timed out as expected:", e)
if hasattr(s, "check"):  # torch 2.x binds check(); 1.13 does not
    assert s.check(["k", "n"])
    assert not s.check(["k", "never"])
nk = s.num_keys()
assert s.delete_key("k") is True
assert s.delete_key("k") is False
assert s.num_keys() == nk - 1
s.set("from_python", "hello")
print("NUM_KEYS", nk, "TORCH", torch.__version__)
print("PYTHON_OK")
)PY");
  const std::string cmd = "timeout -k 5 120 " + std::string(kPython) + " " + script +
                          " 127.0.0.1 " + std::to_string(server->port()) + " 2>&1";
  CmdResult r = Run(cmd);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("PYTHON_OK") != std::string::npos);
  // TCPStore prefixes keys with "/" and counts workers in "init/".
  CHECK(server->engine().Get("/n") == std::optional<std::string>("7"));
  CHECK(server->engine().Get("/cas") == std::optional<std::string>("second"));
  CHECK(server->engine().Get("/from_python") == std::optional<std::string>("hello"));
  CHECK(server->engine().Get("init/") == std::optional<std::string>("1"));
  CHECK_FALSE(server->engine().Get("/k").has_value());
  std::remove(script.c_str());
}

// ---------------------------------------------------------------------------
// (c) two gloo workers bootstrapping through the store, as under the agent

TEST_CASE("torch init_process_group(env://) with TORCHELASTIC_USE_AGENT_STORE uses the server",
          "[integration][torch]") {
  if (!TorchAvailable()) {
    return SkipCase("integration", "/usr/bin/python3 cannot import torch.distributed");
  }
  auto server = StartServer();
  const std::string script = WriteScript("gloo", R"PY(
import os, datetime
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
dist.all_reduce(t)
print("RANK", rank, "RESULT", t.tolist())
assert t.tolist() == [3.0, 30.0], t.tolist()
dist.barrier()
dist.destroy_process_group()
print("WORKER_OK", rank)
)PY");
  auto command = [&](int rank) {
    return "env MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(server->port()) +
           " RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(rank) +
           " WORLD_SIZE=2 TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0"
           " GLOO_SOCKET_IFNAME=lo timeout -k 5 120 " +
           kPython + " " + script + " 2>&1";
  };
  FILE* p0 = ::popen(command(0).c_str(), "r");
  FILE* p1 = ::popen(command(1).c_str(), "r");
  REQUIRE(p0 != nullptr);
  REQUIRE(p1 != nullptr);
  const std::string out0 = ReadAll(p0);
  const std::string out1 = ReadAll(p1);
  const int rc0 = ExitCode(::pclose(p0));
  const int rc1 = ExitCode(::pclose(p1));
  INFO("rank 0:\n" << out0 << "\nrank 1:\n" << out1);
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  CHECK(out0.find("WORKER_OK 0") != std::string::npos);
  CHECK(out1.find("WORKER_OK 1") != std::string::npos);
  CHECK(out0.find("RESULT [3.0, 30.0]") != std::string::npos);
  // Both workers went through this store, under the agent-store prefix
  // (TCPStore adds "/", env:// adds "/worker/attempt_<restart count>", the
  // default group "/default_pg"): torch 1.13's store-based barrier after init
  // counted both ranks here.
  CHECK(server->engine().Get("//worker/attempt_0/default_pg/store_based_barrier_key:1") ==
        std::optional<std::string>("2"));
  CHECK(server->engine().Get("init/") == std::optional<std::string>("2"));  // 2 clients joined
  std::remove(script.c_str());
}

// ---------------------------------------------------------------------------
// (d) misbehaving clients

TEST_CASE("garbage and stalled clients do not disturb a good client", "[integration]") {
  auto server = StartServer();
  const int port = server->port();

  RawConn http(port);  // 'G' is no query type in either dialect
  http.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  RawConn oversized(port);  // legacy SET with a 1 TiB key
  oversized.Send(Msg(legacy::kSet).U64(1ull << 40));
  RawConn huge_value(port);  // modern SET with a 2 MiB value
  huge_value.Send(Msg(modern::kValidate).U32(kMagic));
  huge_value.Send(Msg(modern::kSet).Str("k").U64(2u << 20));
  RawConn bad_magic(port);  // a first byte 0 that is neither VALIDATE nor a sane SET
  bad_magic.Send(std::string("\0\x01\x02\x03\x04\x05\x06\x07\x08", 9));
  RawConn many_keys(port);
  many_keys.Send(Msg(legacy::kWait).U64(kMaxWaitKeys + 1));
  RawConn stalled(port);  // half a request, then silence
  stalled.Send(Msg(modern::kValidate).U32(kMagic));
  stalled.Send(std::string(Msg(modern::kSet).Str("stalled-key")).substr(0, 12));

  // A good client works meanwhile, and promptly.
  auto client = C10dStoreClient::Connect("127.0.0.1", port, 5.0);
  REQUIRE(client.ok());
  const auto start = SteadyClock::now();
  for (int i = 0; i < 50; ++i) {
    REQUIRE((*client)->Set("k" + std::to_string(i), std::to_string(i)).ok());
    auto v = (*client)->Get("k" + std::to_string(i), 5.0);
    REQUIRE(v.ok());
    CHECK(*v == std::to_string(i));
  }
  CHECK(SteadyClock::now() - start < seconds(5));

  CHECK(http.ClosedByServer(seconds(5)));
  CHECK(oversized.ClosedByServer(seconds(5)));
  CHECK(huge_value.ClosedByServer(seconds(5)));
  CHECK(bad_magic.ClosedByServer(seconds(5)));
  CHECK(many_keys.ClosedByServer(seconds(5)));
  CHECK(stalled.Silent(milliseconds(200)));  // kept open, harmless
  CHECK_FALSE(server->engine().Get("stalled-key").has_value());

  // A client that disconnects while waiting leaves no waiter behind.
  {
    RawConn quitter(port);
    quitter.Send(Msg(modern::kValidate).U32(kMagic));
    quitter.Send(Msg(modern::kWait).U64(1).Str("forever"));
    CHECK(quitter.Silent(milliseconds(100)));
    CHECK(server->engine().NumWaiters() == 1);
  }
  const auto deadline = SteadyClock::now() + seconds(5);
  while (server->engine().NumWaiters() != 0 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  CHECK(server->engine().NumWaiters() == 0);
  CHECK(*(*client)->Add("still-fine", 1) == 1);
}

TEST_CASE("a client that writes and disconnects at once still has its SET applied",
          "[integration]") {
  auto server = StartServer();
  {
    RawConn c(server->port());
    c.Send(Msg(modern::kValidate).U32(kMagic));
    c.Send(Msg(modern::kSet).Str("fire-and-forget").Str("done"));
  }
  auto client = C10dStoreClient::Connect("127.0.0.1", server->port(), 5.0);
  REQUIRE(client.ok());
  auto v = (*client)->Get("fire-and-forget", 5.0);
  REQUIRE(v.ok());
  CHECK(*v == "done");
}

// ---------------------------------------------------------------------------
// (e) port in use, and shutdown

TEST_CASE("C10dStoreServer reports a port in use clearly", "[integration]") {
  auto first = StartServer();
  auto second = C10dStoreServer::Start(C10dStoreServerOptions{"127.0.0.1", first->port()});
  REQUIRE_FALSE(second.ok());
  const std::string msg(second.status().message());
  CHECK(msg == "cannot bind the TCPStore on 127.0.0.1:" + std::to_string(first->port()) +
                   ": address already in use; choose another --master_port or stop the "
                   "process that holds it");

  auto bad_host = C10dStoreServer::Start(C10dStoreServerOptions{"no-such-host.invalid", 0});
  REQUIRE_FALSE(bad_host.ok());
  CHECK(std::string(bad_host.status().message()).find("cannot bind the TCPStore on") == 0);
}

TEST_CASE("C10dStoreServer shuts down promptly with clients connected and waiting",
          "[integration]") {
  auto server = StartServer();
  auto client = C10dStoreClient::Connect("127.0.0.1", server->port(), 5.0);
  REQUIRE(client.ok());
  RawConn idle(server->port());
  RawConn waiting(server->port());
  waiting.Send(Msg(modern::kValidate).U32(kMagic));
  waiting.Send(Msg(modern::kWait).U64(1).Str("never"));
  CHECK(waiting.Silent(milliseconds(50)));

  absl::Status get_status;
  std::thread getter([&] { get_status = (*client)->Get("never", 30.0).status(); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = SteadyClock::now();
  server.reset();
  CHECK(SteadyClock::now() - start < seconds(2));
  getter.join();
  CHECK(SteadyClock::now() - start < seconds(5));
  CHECK(absl::IsUnavailable(get_status));
  CHECK(waiting.ClosedByServer(seconds(2)));
  CHECK(idle.ClosedByServer(seconds(2)));
}

}  // namespace
}  // namespace ddprun::rendezvous
