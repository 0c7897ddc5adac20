// Scale tests of C10dStoreServer (issue 12): a thousand simulated torch 1.13
// workers bootstrap against one store (bench/store_load.h: check-in ADD, the
// backend's unique id SET by rank 0 and WAITed+GOT by the others, an ADD+WAIT
// barrier), alone and next to thousands of bad clients. They assert results,
// never time: the timeouts only turn a hang into a failure.
#include <sys/resource.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "store_load.h"

namespace ddprun::rendezvous {
namespace {

using ddprun::bench::BootstrapOptions;
using ddprun::bench::RunBootstrap;

std::unique_ptr<C10dStoreServer> StartServer() {
  RaiseOpenFileLimit();
  auto server = C10dStoreServer::Start(C10dStoreServerOptions{"127.0.0.1", 0});
  REQUIRE(server.ok());
  return *std::move(server);
}

// Every good client checked in exactly once (the ADDs returned 1..N), read
// the id rank 0 set, and passed the barrier.
void RequireBootstrapped(const BootstrapOptions& opts, const C10dStoreServer& server,
                         KvEngine& engine) {
  auto res = RunBootstrap(opts);
  REQUIRE(res.ok());
  CHECK(res->clients_done == opts.clients);
  CHECK(res->wrong_uid == 0);
  CHECK(res->checkin_counts_ok);
  CHECK(engine.Get(opts.key_prefix + "init") == std::to_string(opts.clients));
  CHECK(engine.Get(opts.key_prefix + "barrier") == std::to_string(opts.clients));
  CHECK(engine.Get(opts.key_prefix + "uid") == opts.uid_value);
  (void)server;
}

TEST_CASE("1000 torch 1.13 clients bootstrap against one store", "[integration][scale]") {
  auto server = StartServer();
  BootstrapOptions opts;
  opts.port = server->port();
  opts.clients = 1000;
  opts.timeout_s = 60;
  RequireBootstrapped(opts, *server, server->engine());

  SECTION("with the silent second connection of each worker, twice on one store") {
    BootstrapOptions again = opts;
    again.conns_per_client = 2;
    again.key_prefix = "second_round/";
    again.uid_value = "another-unique-id";
    RequireBootstrapped(again, *server, server->engine());
  }
}

TEST_CASE("bad clients by the thousand do not disturb a bootstrap on the same store",
          "[integration][scale]") {
  auto server = StartServer();
  // A thousand of each kind of bad client next to a thousand good ones: both
  // ends of every connection are in this process. Fewer where the open-file
  // limit (raised to its hard limit above) cannot hold them, said so.
  const std::uint64_t limit = RaiseOpenFileLimit();
  constexpr std::uint64_t kReserved = 512;  // the test's own files, the server's
  const int bad = static_cast<int>(std::min<std::uint64_t>(
      1000, limit > 2 * 1000 + kReserved ? (limit - 2 * 1000 - kReserved) / (3 * 2) : 0));
  if (bad < 1000) WARN("open-file limit " << limit << ": " << bad << " bad clients of each kind");
  REQUIRE(bad >= 100);
  BootstrapOptions opts;
  opts.port = server->port();
  opts.clients = 1000;
  opts.timeout_s = 60;
  opts.silent_clients = bad;        // connect, send nothing
  opts.half_request_clients = bad;  // half a SET, never the rest
  opts.disconnect_clients = bad;    // WAIT on the barrier key, gone mid-wait
  RequireBootstrapped(opts, *server, server->engine());
  // The disconnected waiters were cancelled, not leaked; the half-sent SET
  // never reached the engine.
  CHECK(server->engine().NumWaiters() == 0);
  CHECK_FALSE(server->engine().Get(opts.key_prefix + "half").has_value());

  SECTION("and the store still serves a second job once they are gone") {
    BootstrapOptions next;
    next.port = server->port();
    next.clients = 500;
    next.timeout_s = 60;
    next.key_prefix = "next_job/";
    RequireBootstrapped(next, *server, server->engine());
  }
}

}  // namespace
}  // namespace ddprun::rendezvous
