// Unit tests of the TCPStore's semantics (c10d::RequestHandler) over a
// KvEngine: requests built with the codec, replies read back from the
// session. No sockets, no threads.
#include "ddprun/rendezvous/store/c10d_store_handler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"

namespace ddprun::rendezvous::c10d {
namespace {

Request Req(Op op, std::vector<std::string_view> keys = {},
            std::vector<std::string_view> values = {}) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

// A session and the WAIT completions the engine reported for it.
struct Client {
  explicit Client(KvEngine* engine) : handler(engine) {}

  absl::Status Send(const Request& req) {
    return handler.Handle(req, &session, [this](std::uint64_t token, absl::Status st) {
      done.emplace_back(token, std::move(st));
    });
  }
  // Hands the recorded completions back, as the server loop does.
  absl::Status Deliver() {
    std::vector<std::pair<std::uint64_t, absl::Status>> now;
    now.swap(done);
    for (auto& [token, st] : now) {
      DDPRUN_RETURN_IF_ERROR(handler.OnWaitDone(&session, token, st));
    }
    return absl::OkStatus();
  }
  std::string Take(std::size_t n) {
    REQUIRE(session.out.size() >= n);
    std::string head = session.out.substr(0, n);
    session.out.erase(0, n);
    return head;
  }
  std::uint8_t U8() { return static_cast<std::uint8_t>(Take(1)[0]); }
  std::int64_t I64() {
    std::int64_t v;
    std::memcpy(&v, Take(8).data(), 8);
    return v;
  }
  std::string String() {
    std::uint64_t n;
    std::memcpy(&n, Take(8).data(), 8);
    return Take(n);
  }

  RequestHandler handler;
  Session session;
  std::vector<std::pair<std::uint64_t, absl::Status>> done;
};

TEST_CASE("c10d handler: set, get, add, check, delete, multi-get and -set, append", "[unit]") {
  KvEngine engine;
  Client c(&engine);
  REQUIRE(c.Send(Req(Op::kSet, {"/a"}, {"1"})).ok());
  CHECK(c.session.out.empty());  // SET has no reply
  REQUIRE(c.Send(Req(Op::kGet, {"/a"})).ok());
  CHECK(c.String() == "1");
  REQUIRE(c.Send(Req(Op::kGet, {"/missing"})).ok());
  CHECK(c.String().empty());

  Request add = Req(Op::kAdd, {"/n"});
  add.delta = 5;
  REQUIRE(c.Send(add).ok());
  CHECK(c.I64() == 5);
  add.delta = -7;
  REQUIRE(c.Send(add).ok());
  CHECK(c.I64() == -2);

  REQUIRE(c.Send(Req(Op::kCheck, {"/a", "/n"})).ok());
  CHECK(c.U8() == kCheckReady);
  REQUIRE(c.Send(Req(Op::kCheck, {"/a", "/nope"})).ok());
  CHECK(c.U8() == kCheckNotReady);
  REQUIRE(c.Send(Req(Op::kGetNumKeys)).ok());
  CHECK(c.I64() == 2);

  REQUIRE(c.Send(Req(Op::kAppend, {"/log"}, {"ab"})).ok());
  REQUIRE(c.Send(Req(Op::kAppend, {"/log"}, {"cd"})).ok());
  REQUIRE(c.Send(Req(Op::kMultiSet, {"/m1", "/m2"}, {"x", "y"})).ok());
  REQUIRE(c.Send(Req(Op::kMultiGet, {"/log", "/m1", "/m2", "/none"})).ok());
  CHECK(c.String() == "abcd");
  CHECK(c.String() == "x");
  CHECK(c.String() == "y");
  CHECK(c.String().empty());

  REQUIRE(c.Send(Req(Op::kDeleteKey, {"/m1"})).ok());
  CHECK(c.I64() == 1);
  REQUIRE(c.Send(Req(Op::kDeleteKey, {"/m1"})).ok());
  CHECK(c.I64() == 0);

  Request ping = Req(Op::kPing);
  ping.u32 = 4242;
  REQUIRE(c.Send(ping).ok());
  std::uint32_t echo;
  std::memcpy(&echo, c.Take(4).data(), 4);
  CHECK(echo == 4242);
  CHECK(c.session.out.empty());
}

TEST_CASE("c10d handler: COMPARE_SET follows torch", "[unit]") {
  KvEngine engine;
  Client c(&engine);
  // An empty expected on a missing key sets it.
  REQUIRE(c.Send(Req(Op::kCompareSet, {"/cas"}, {"", "first"})).ok());
  CHECK(c.String() == "first");
  // A mismatch returns the current value and changes nothing.
  REQUIRE(c.Send(Req(Op::kCompareSet, {"/cas"}, {"wrong", "second"})).ok());
  CHECK(c.String() == "first");
  REQUIRE(c.Send(Req(Op::kCompareSet, {"/cas"}, {"first", "second"})).ok());
  CHECK(c.String() == "second");
  // A missing key with a non-empty expected is left alone; expected comes back.
  REQUIRE(c.Send(Req(Op::kCompareSet, {"/missing"}, {"x", "y"})).ok());
  CHECK(c.String() == "x");
  CHECK_FALSE(engine.Get("/missing").has_value());
  // An empty expected also matches an empty value.
  REQUIRE(engine.Set("/empty", "").ok());
  REQUIRE(c.Send(Req(Op::kCompareSet, {"/empty"}, {"", "filled"})).ok());
  CHECK(c.String() == "filled");
}

TEST_CASE("c10d handler: WAIT parks until the keys exist; CANCEL_WAIT cancels", "[unit]") {
  KvEngine engine;
  Client c(&engine);
  REQUIRE(engine.Set("/here", "1").ok());
  REQUIRE(c.Send(Req(Op::kWait, {"/here"})).ok());
  CHECK(c.U8() == kStopWaiting);  // at once

  REQUIRE(c.Send(Req(Op::kWait, {"/here", "/later"})).ok());
  CHECK(c.session.out.empty());
  CHECK(c.session.waits.size() == 1);
  CHECK(engine.NumWaiters() == 1);
  REQUIRE(engine.Set("/later", "2").ok());  // another client's SET
  REQUIRE(c.done.size() == 1);
  REQUIRE(c.Deliver().ok());
  CHECK(c.U8() == kStopWaiting);
  CHECK(c.session.waits.empty());

  REQUIRE(c.Send(Req(Op::kWait, {"/never"})).ok());
  REQUIRE(c.Send(Req(Op::kCancelWait)).ok());
  CHECK(c.U8() == kWaitCanceled);
  CHECK(engine.NumWaiters() == 0);
  // The cancelled wait's completion arrives, and is dropped: no stray reply.
  REQUIRE(c.Deliver().ok());
  CHECK(c.session.out.empty());
  REQUIRE(engine.Set("/never", "now").ok());
  REQUIRE(c.Deliver().ok());
  CHECK(c.session.out.empty());

  // A client that leaves cancels its waits.
  REQUIRE(c.Send(Req(Op::kWait, {"/gone"})).ok());
  c.handler.CancelWaits(&c.session, absl::CancelledError("the client disconnected"));
  CHECK(engine.NumWaiters() == 0);
}

// torch 2.11's queue_push/queue_pop/queue_len and list_keys, as its libuv
// server answers them (replies checked against torch 2.11 on a GPU machine:
// tests/gpu/store_dialect.py).
TEST_CASE("c10d handler: queues are FIFO, apart from keys; LIST_KEYS lists keys", "[unit]") {
  KvEngine engine;
  Client c(&engine);
  REQUIRE(c.Send(Req(Op::kQueueLen, {"/q"})).ok());
  CHECK(c.I64() == 0);
  REQUIRE(c.Send(Req(Op::kQueuePop, {"/q"})).ok());
  CHECK(c.I64() == 0);  // empty: the length and nothing else
  CHECK(c.session.out.empty());
  REQUIRE(c.Send(Req(Op::kQueuePush, {"/q"}, {"one"})).ok());
  REQUIRE(c.Send(Req(Op::kQueuePush, {"/q"}, {std::string("t\0o", 3)})).ok());
  CHECK(c.session.out.empty());  // QUEUE_PUSH has no reply
  REQUIRE(c.Send(Req(Op::kQueueLen, {"/q"})).ok());
  CHECK(c.I64() == 2);
  // A queue is not a key: GETNUMKEYS and GET do not see it, CHECK does.
  REQUIRE(c.Send(Req(Op::kGetNumKeys)).ok());
  CHECK(c.I64() == 0);
  REQUIRE(c.Send(Req(Op::kCheck, {"/q"})).ok());
  CHECK(c.U8() == kCheckReady);
  REQUIRE(c.Send(Req(Op::kQueuePop, {"/q"})).ok());
  CHECK(c.I64() == 2);
  CHECK(c.String() == "one");
  REQUIRE(c.Send(Req(Op::kQueuePop, {"/q"})).ok());
  CHECK(c.I64() == 1);
  CHECK(c.String() == std::string("t\0o", 3));
  REQUIRE(c.Send(Req(Op::kQueuePop, {"/q"})).ok());
  CHECK(c.I64() == 0);
  CHECK(c.session.out.empty());
  REQUIRE(c.Send(Req(Op::kCheck, {"/q"})).ok());
  CHECK(c.U8() == kCheckNotReady);

  // A blocking pop is WAIT, then QUEUE_POP: a push wakes one waiter, not all.
  Client other(&engine);
  REQUIRE(c.Send(Req(Op::kWait, {"/w"})).ok());
  REQUIRE(other.Send(Req(Op::kWait, {"/w"})).ok());
  CHECK(engine.NumWaiters() == 2);
  REQUIRE(engine.QueuePush("/w", "item").ok());
  REQUIRE(c.Deliver().ok());
  REQUIRE(other.Deliver().ok());
  CHECK(c.U8() == kStopWaiting);  // the older waiter
  CHECK(other.session.out.empty());
  CHECK(engine.NumWaiters() == 1);
  REQUIRE(engine.QueuePush("/w", "item2").ok());
  REQUIRE(other.Deliver().ok());
  CHECK(other.U8() == kStopWaiting);

  REQUIRE(c.Send(Req(Op::kSet, {"/k1"}, {"v"})).ok());
  REQUIRE(c.Send(Req(Op::kSet, {"/k2"}, {"v"})).ok());
  REQUIRE(c.Send(Req(Op::kListKeys)).ok());
  REQUIRE(c.I64() == 2);
  std::vector<std::string> keys = {c.String(), c.String()};
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"/k1", "/k2"});  // not the queue "/w"
  CHECK(c.session.out.empty());
}

// One whole session of torch 2.11's TCPStore client (every query of its Python
// API, tests/gpu/store_dialect.py, recorded on a GPU machine against torch's
// own libuv server): served here, it must get torch's server's replies byte
// for byte.
TEST_CASE("c10d handler: torch 2.11's session gets torch's server's replies byte for byte",
          "[unit]") {
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string src = DDPRUN_SOURCE_DIR;
  const std::string up = read(src + "/tests/fuzz/corpus/c10d_wire/capture_torch2.11_conn0");
  const std::string down =
      read(src + "/tests/unit/rendezvous/store/data/torch2.11_libuv_server_replies");
  KvEngine engine;
  Client c(&engine);
  RequestDecoder decoder;
  std::size_t offset = 0;
  std::vector<Op> ops;
  while (offset < up.size()) {
    Request req;
    DecodeResult r = decoder.Decode(std::string_view(up).substr(offset), &req);
    REQUIRE(r.status == DecodeStatus::kComplete);
    offset += r.consumed;
    ops.push_back(req.op);
    REQUIRE(c.Send(req).ok());
    REQUIRE(c.Deliver().ok());
  }
  CHECK(decoder.dialect() == Dialect::kModern);
  for (Op op : {Op::kValidate, Op::kPing, Op::kQueuePush, Op::kQueuePop, Op::kQueueLen,
                Op::kListKeys, Op::kCancelWait, Op::kMultiGet}) {
    INFO(OpName(op));
    CHECK(std::count(ops.begin(), ops.end(), op) > 0);
  }
  CHECK(c.session.out.size() == down.size());
  CHECK(c.session.out == down);
}

TEST_CASE("c10d handler: refused requests say why", "[unit]") {
  KvEngine engine;
  Client c(&engine);
  Request validate = Req(Op::kValidate);
  validate.u32 = kValidationMagic;
  CHECK(c.Send(validate).ok());
  validate.u32 = 1;
  absl::Status st = c.Send(validate);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message() == "VALIDATE sent a wrong magic number");

  st = c.Send(Req(Op::kWatchKey, {"/a"}));
  CHECK(absl::IsUnimplemented(st));
  CHECK(st.message() ==
        "WATCH_KEY (TCPStore.watch_key of torch 1.x) is not supported by ddprun's store");
  st = c.Send(Req(Op::kQueuePush, {"/q"}, {std::string(kMaxValueBytes + 1, 'x')}));
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message().find("exceeds the limit") != std::string_view::npos);

  // An ADD on a value that is no number is the engine's error.
  REQUIRE(engine.Set("/text", "abc").ok());
  Request add = Req(Op::kAdd, {"/text"});
  add.delta = 1;
  CHECK_FALSE(c.Send(add).ok());
  CHECK(c.session.out.empty());
}

}  // namespace
}  // namespace ddprun::rendezvous::c10d

TEST_CASE("StoreCapacityWarning names ulimit -n and the count needed", "[unit]") {
  using ddprun::rendezvous::StoreCapacityWarning;
  CHECK(StoreCapacityWarning(8, 1024).empty());
  CHECK(StoreCapacityWarning(9968, 20000).empty());  // 2 * 9968 + 64 = 20000
  const std::string w = StoreCapacityWarning(16000, 20000);
  CHECK(w.find("32064") != std::string::npos);
  CHECK(w.find("ulimit -n 32064") != std::string::npos);
  CHECK(w.find('\n') == std::string::npos);
}
