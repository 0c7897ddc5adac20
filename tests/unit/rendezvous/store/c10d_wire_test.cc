// Unit tests of the c10d TCPStore wire codec: byte strings in, requests out
// (no sockets). The requests are built by hand here, independently of the
// codec's encoder, then checked against it.
#include "ddprun/rendezvous/store/c10d_wire.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ddprun/rendezvous/store/kv_engine.h"
#include "support/c10d_msg.h"

namespace ddprun::rendezvous::c10d {
namespace {

using ::ddprun::test::Msg;

// One request of every query type the server knows, with what it decodes to.
struct Case {
  Dialect dialect;
  std::string bytes;
  Op op;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::int64_t delta = 0;
  std::uint32_t u32 = 0;
};

std::vector<Case> AllQueries() {
  const Dialect m = Dialect::kModern, l = Dialect::kLegacy;
  return {
      {m, Msg(0).U32(kValidationMagic), Op::kValidate, {}, {}, 0, kValidationMagic},
      {m, Msg(1).Str("/k").Str("v"), Op::kSet, {"/k"}, {"v"}},
      {m, Msg(2).Str("/k").Str("").Str("new"), Op::kCompareSet, {"/k"}, {"", "new"}},
      {m, Msg(3).Str("/k"), Op::kGet, {"/k"}, {}},
      {m, Msg(4).Str("/n").I64(-7), Op::kAdd, {"/n"}, {}, -7},
      {m, Msg(5).U64(2).Str("a").Str("b"), Op::kCheck, {"a", "b"}, {}},
      {m, Msg(6).U64(1).Str("w"), Op::kWait, {"w"}, {}},
      {m, Msg(7), Op::kGetNumKeys, {}, {}},
      {m, Msg(8).Str("d"), Op::kDeleteKey, {"d"}, {}},
      {m, Msg(9).Str("log").Str("ab"), Op::kAppend, {"log"}, {"ab"}},
      {m, Msg(10).U64(3).Str("x").Str("").Str("z"), Op::kMultiGet, {"x", "", "z"}, {}},
      {m,
       Msg(11).U64(2).Str("a").Str("1").Str("b").Str("2"),
       Op::kMultiSet,
       {"a", "b"},
       {"1", "2"}},
      {m, Msg(12), Op::kCancelWait, {}, {}},
      {m, Msg(13).U32(12345), Op::kPing, {}, {}, 0, 12345},
      {m, Msg(14).Str("q").Str("item"), Op::kQueuePush, {"q"}, {"item"}},
      {m, Msg(15).Str("q"), Op::kQueuePop, {"q"}, {}},
      {m, Msg(16).Str("q"), Op::kQueueLen, {"q"}, {}},
      {m, Msg(17), Op::kListKeys, {}, {}},
      {l,
       Msg(0).Str("/k").Str(std::string("\0\xff", 2)),
       Op::kSet,
       {"/k"},
       {std::string("\0\xff", 2)}},
      {l, Msg(1).Str("/k").Str("old").Str("new"), Op::kCompareSet, {"/k"}, {"old", "new"}},
      {l, Msg(2).Str("/k"), Op::kGet, {"/k"}, {}},
      {l, Msg(3).Str("init/").I64(1), Op::kAdd, {"init/"}, {}, 1},
      {l, Msg(4).U64(0), Op::kCheck, {}, {}},
      {l, Msg(5).U64(1).Str("w"), Op::kWait, {"w"}, {}},
      {l, Msg(6), Op::kGetNumKeys, {}, {}},
      {l, Msg(7).Str("watched"), Op::kWatchKey, {"watched"}, {}},
      {l, Msg(8).Str("d"), Op::kDeleteKey, {"d"}, {}},
      {l, Msg(9).Str("log").Str("x"), Op::kAppend, {"log"}, {"x"}},
      {l, Msg(10).U64(1).Str("m"), Op::kMultiGet, {"m"}, {}},
      {l, Msg(11).U64(1).Str("m").Str("y"), Op::kMultiSet, {"m"}, {"y"}},
      {l, Msg(12), Op::kCancelWait, {}, {}},
  };
}

std::vector<std::string> Strings(const std::vector<std::string_view>& views) {
  return std::vector<std::string>(views.begin(), views.end());
}

TEST_CASE("c10d wire: every query type of both dialects decodes and re-encodes", "[unit]") {
  for (const Case& c : AllQueries()) {
    INFO(DialectName(c.dialect) << " " << OpName(c.op));
    Request req;
    const std::string bytes = c.bytes + "trailing";  // the next request's bytes stay unread
    DecodeResult r = DecodeRequest(c.dialect, bytes, &req);
    REQUIRE(r.status == DecodeStatus::kComplete);
    CHECK(r.consumed == c.bytes.size());
    CHECK(req.op == c.op);
    CHECK(Strings(req.keys) == c.keys);
    CHECK(Strings(req.values) == c.values);
    CHECK(req.delta == c.delta);
    CHECK(req.u32 == c.u32);
    CHECK(QueryType(c.dialect, c.op) == static_cast<std::uint8_t>(c.bytes[0]));
    CHECK(OpOf(c.dialect, static_cast<std::uint8_t>(c.bytes[0])) == c.op);

    std::string encoded;
    REQUIRE(EncodeRequest(c.dialect, req, &encoded).ok());
    CHECK(encoded == c.bytes);
  }
}

TEST_CASE("c10d wire: every truncation asks for more bytes, never past the request", "[unit]") {
  for (const Case& c : AllQueries()) {
    INFO(DialectName(c.dialect) << " " << OpName(c.op));
    for (std::size_t n = 0; n < c.bytes.size(); ++n) {
      INFO("prefix of " << n << " bytes");
      Request req;
      DecodeResult r = DecodeRequest(c.dialect, std::string_view(c.bytes).substr(0, n), &req);
      REQUIRE(r.status == DecodeStatus::kNeedMore);
      CHECK(r.need > n);
      CHECK(r.need <= c.bytes.size());
    }
  }
}

TEST_CASE("c10d wire: the decoder detects the dialect from the first bytes", "[unit]") {
  Request req;
  SECTION("VALIDATE with the magic is torch 2.x, and the dialect sticks") {
    RequestDecoder d;
    const std::string validate = Msg(0).U32(kValidationMagic);
    CHECK(d.Decode(validate.substr(0, 3), &req).status == DecodeStatus::kNeedMore);
    CHECK(d.Decode(validate.substr(0, 3), &req).need == 5);
    CHECK(d.dialect() == Dialect::kUnknown);
    DecodeResult r = d.Decode(validate, &req);
    REQUIRE(r.status == DecodeStatus::kComplete);
    CHECK(d.dialect() == Dialect::kModern);
    CHECK(req.op == Op::kValidate);
    // 3 is GET in torch 2.x (ADD in torch 1.13).
    r = d.Decode(std::string(Msg(3).Str("/k")), &req);
    REQUIRE(r.status == DecodeStatus::kComplete);
    CHECK(req.op == Op::kGet);
  }
  SECTION("a 0 without the magic is a torch 1.13 SET") {
    RequestDecoder d;
    DecodeResult r = d.Decode(std::string(Msg(0).Str("/k").Str("v")), &req);
    REQUIRE(r.status == DecodeStatus::kComplete);
    CHECK(d.dialect() == Dialect::kLegacy);
    CHECK(req.op == Op::kSet);
  }
  SECTION("a non-zero first byte is torch 1.13 at once") {
    RequestDecoder d;
    CHECK(d.Decode(std::string(1, '\x03'), &req).status == DecodeStatus::kNeedMore);
    CHECK(d.dialect() == Dialect::kLegacy);
  }
  SECTION("nothing is nothing") {
    RequestDecoder d;
    DecodeResult r = d.Decode("", &req);
    CHECK(r.status == DecodeStatus::kNeedMore);
    CHECK(r.need == 1);
    CHECK(d.dialect() == Dialect::kUnknown);
  }
}

TEST_CASE("c10d wire: lengths over the limits are errors as soon as they arrive", "[unit]") {
  Request req;
  // Only the length field is sent: the decoder must not wait for the bytes.
  DecodeResult r = DecodeRequest(Dialect::kLegacy, std::string(Msg(0).U64(1ull << 40)), &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error == "SET sent a key of 1099511627776 bytes, over the limit of 4096");

  r = DecodeRequest(Dialect::kModern, std::string(Msg(1).Str("k").U64(kMaxValueBytes + 1)), &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error == "SET sent a value of 1048577 bytes, over the limit of 1048576");

  r = DecodeRequest(Dialect::kModern, std::string(Msg(6).U64(kMaxWaitKeys + 1)), &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error == "WAIT sent a count of 65537 keys, over the limit of 65536");

  r = DecodeRequest(Dialect::kModern, std::string(Msg(11).U64(~0ull)), &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error.find("MULTI_SET sent a count of 18446744073709551615 keys") == 0);

  // Exactly at the limits is fine.
  r = DecodeRequest(
      Dialect::kModern,
      std::string(Msg(1).Str(std::string(kMaxKeyBytes, 'k')).Str(std::string(kMaxValueBytes, 'v'))),
      &req);
  CHECK(r.status == DecodeStatus::kComplete);
}

TEST_CASE("c10d wire: a whole request is bounded however its bytes arrive", "[unit]") {
  // MULTI_SET of 65 values of 1 MiB: each field is within its limit, the whole is not.
  Msg m(11);
  m.U64(65);
  for (int i = 0; i < 65; ++i) m.Str("k" + std::to_string(i)).Str(std::string(kMaxValueBytes, 'v'));
  const std::string bytes = m;
  REQUIRE(bytes.size() > kMaxRequestBytes);
  Request req;
  // Arriving whole.
  DecodeResult r = DecodeRequest(Dialect::kModern, bytes, &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error.find("MULTI_SET is a request of at least") == 0);
  // Arriving in pieces: the decoder never asks for more than the limit.
  r = DecodeRequest(Dialect::kModern, std::string_view(bytes).substr(0, kMaxRequestBytes - 100),
                    &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error.find("over the limit of 67108864") != std::string::npos);
}

TEST_CASE("c10d wire: garbage is an error naming the query type", "[unit]") {
  Request req;
  DecodeResult r = DecodeRequest(Dialect::kLegacy, "GET / HTTP/1.1\r\n", &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error == "unknown query type 71 (torch 1.13 dialect)");
  r = DecodeRequest(Dialect::kModern, std::string(1, '\x12'), &req);
  REQUIRE(r.status == DecodeStatus::kError);
  CHECK(r.error ==
        "unknown query type 18 (queries newer than torch 2.11's LIST_KEYS are not supported)");
  for (int type = 0; type < 256; ++type) {
    const bool legacy_known = type <= 12, modern_known = type <= 17;
    CHECK((OpOf(Dialect::kLegacy, type) != Op::kUnknown) == legacy_known);
    CHECK((OpOf(Dialect::kModern, type) != Op::kUnknown) == modern_known);
    CHECK(OpOf(Dialect::kUnknown, type) == Op::kUnknown);
  }
  // A stream of requests stops at the first bad one.
  RequestDecoder d(Dialect::kModern);
  const std::string stream = std::string(Msg(7)) + std::string(Msg(200)) + std::string(Msg(7));
  r = d.Decode(stream, &req);
  REQUIRE(r.status == DecodeStatus::kComplete);
  r = d.Decode(std::string_view(stream).substr(r.consumed), &req);
  CHECK(r.status == DecodeStatus::kError);
}

TEST_CASE("c10d wire: what torch 1.13's TCPStore client really sent decodes to the last byte",
          "[unit]") {
  // Captured by tests/fuzz/capture_torch_store.py (also fuzz seeds).
  const std::string dir = std::string(DDPRUN_SOURCE_DIR) + "/tests/fuzz/corpus/c10d_wire/";
  for (const char* name :
       {"capture_torch1.13_conn0", "capture_torch1.13_conn2", "capture_torch1.13_conn4"}) {
    INFO(name);
    std::ifstream in(dir + name, std::ios::binary);
    REQUIRE(in);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE_FALSE(bytes.empty());
    RequestDecoder d;
    Request req;
    std::size_t offset = 0, requests = 0;
    while (offset < bytes.size()) {
      DecodeResult r = d.Decode(std::string_view(bytes).substr(offset), &req);
      REQUIRE(r.status == DecodeStatus::kComplete);
      offset += r.consumed;
      ++requests;
    }
    CHECK(d.dialect() == Dialect::kLegacy);
    CHECK(requests >= 3);
  }
}

TEST_CASE("c10d wire: the encoder refuses what the wire cannot say", "[unit]") {
  std::string out;
  Request ping;
  ping.op = Op::kPing;
  absl::Status st = EncodeRequest(Dialect::kLegacy, ping, &out);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message() == "cannot encode PING: the torch 1.13 dialect has no such query");
  Request watch;
  watch.op = Op::kWatchKey;
  watch.keys = {"k"};
  CHECK(absl::IsInvalidArgument(EncodeRequest(Dialect::kModern, watch, &out)));

  Request set;
  set.op = Op::kSet;
  set.keys = {"k"};
  st = EncodeRequest(Dialect::kModern, set, &out);
  CHECK(st.message() == "cannot encode SET: it takes 1 key(s) and 1 value(s), not 1 and 0");
  const std::string big(kMaxValueBytes + 1, 'x');
  set.values = {big};
  st = EncodeRequest(Dialect::kModern, set, &out);
  CHECK(absl::IsInvalidArgument(st));
  CHECK(st.message() == "cannot encode SET: a value of 1048577 bytes is over the limit of 1048576");
  const std::string long_key(kMaxKeyBytes + 1, 'k');
  set.keys = {long_key};
  set.values = {"v"};
  CHECK(absl::IsInvalidArgument(EncodeRequest(Dialect::kModern, set, &out)));
  CHECK(out.empty());  // nothing appended on error
}

TEST_CASE("c10d wire: reply encoders write host-order fields", "[unit]") {
  std::string out;
  AppendU8(&out, kWaitCanceled);
  AppendU32(&out, 0x01020304u);
  AppendI64(&out, -2);
  AppendString(&out, "ab");
  REQUIRE(out.size() == 1 + 4 + 8 + 8 + 2);
  CHECK(out[0] == 1);
  std::uint32_t u32;
  std::memcpy(&u32, out.data() + 1, 4);
  CHECK(u32 == 0x01020304u);
  std::int64_t i64;
  std::memcpy(&i64, out.data() + 5, 8);
  CHECK(i64 == -2);
  std::uint64_t len;
  std::memcpy(&len, out.data() + 13, 8);
  CHECK(len == 2);
  CHECK(out.substr(21) == "ab");
}

}  // namespace
}  // namespace ddprun::rendezvous::c10d
