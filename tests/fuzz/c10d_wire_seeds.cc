// Writes the seed corpus of fuzz_c10d_wire: one file per query type of each
// dialect, and whole sessions as torch 1.13 and torch 2.x clients send them,
// all encoded by the codec itself.
//   build-fuzz/bin/fuzz_c10d_wire_seeds tests/fuzz/corpus/c10d_wire
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ddprun/rendezvous/store/c10d_wire.h"

namespace c10d = ddprun::rendezvous::c10d;
using c10d::Dialect;
using c10d::Op;

namespace {

std::string Encode(Dialect dialect, const std::vector<c10d::Request>& requests) {
  std::string out;
  for (const c10d::Request& r : requests) {
    const absl::Status st = c10d::EncodeRequest(dialect, r, &out);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
  }
  return out;
}

c10d::Request R(Op op, std::vector<std::string_view> keys = {},
                std::vector<std::string_view> values = {}, std::int64_t delta = 0,
                std::uint32_t u32 = 0) {
  c10d::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.delta = delta;
  r.u32 = u32;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const c10d::Request validate = R(Op::kValidate, {}, {}, 0, c10d::kValidationMagic);
  std::vector<std::pair<std::string, std::string>> seeds;
  const std::vector<std::pair<std::string, c10d::Request>> each = {
      {"set", R(Op::kSet, {"/k"}, {"v"})},
      {"compare_set", R(Op::kCompareSet, {"/cas"}, {"", "first"})},
      {"get", R(Op::kGet, {"/k"})},
      {"add", R(Op::kAdd, {"init/"}, {}, 1)},
      {"check", R(Op::kCheck, {"/a", "/b"})},
      {"wait", R(Op::kWait, {"/w"})},
      {"getnumkeys", R(Op::kGetNumKeys)},
      {"watch_key", R(Op::kWatchKey, {"/watched"})},
      {"delete_key", R(Op::kDeleteKey, {"/k"})},
      {"append", R(Op::kAppend, {"/log"}, {"ab"})},
      {"multi_get", R(Op::kMultiGet, {"/m1", "/m2"})},
      {"multi_set", R(Op::kMultiSet, {"/m1", "/m2"}, {"x", "y"})},
      {"cancel_wait", R(Op::kCancelWait)},
      {"ping", R(Op::kPing, {}, {}, 0, 4242)},
      {"queue_push", R(Op::kQueuePush, {"/q"}, {"item"})},
      {"queue_pop", R(Op::kQueuePop, {"/q"})},
      {"queue_len", R(Op::kQueueLen, {"/q"})},
      {"list_keys", R(Op::kListKeys)},
  };
  for (const auto& [name, req] : each) {
    if (c10d::QueryType(Dialect::kModern, req.op)) {
      seeds.emplace_back("modern_" + name, Encode(Dialect::kModern, {validate, req}));
    }
    if (c10d::QueryType(Dialect::kLegacy, req.op)) {
      seeds.emplace_back("legacy_" + name, Encode(Dialect::kLegacy, {req}));
    }
  }
  // torch 2.x TCPStore client: handshake, worker count, env:// keys, barrier.
  seeds.emplace_back(
      "modern_session",
      Encode(
          Dialect::kModern,
          {validate, R(Op::kPing, {}, {}, 0, 99), R(Op::kAdd, {"init/"}, {}, 1),
           R(Op::kSet, {"/worker/attempt_0/default_pg/0"}, {"rank0-address"}),
           R(Op::kWait, {"/worker/attempt_0/default_pg/1"}),
           R(Op::kMultiGet, {"/worker/attempt_0/default_pg/0", "/worker/attempt_0/default_pg/1"}),
           R(Op::kAdd, {"/default_pg/store_based_barrier_key:1"}, {}, 1),
           R(Op::kCheck, {"/default_pg/store_based_barrier_key:1"}), R(Op::kCancelWait)}));
  // torch 1.13: no handshake; the same bootstrap in the legacy numbering.
  seeds.emplace_back(
      "legacy_session",
      Encode(Dialect::kLegacy,
             {R(Op::kAdd, {"init/"}, {}, 1), R(Op::kSet, {"//worker/attempt_0/0"}, {"addr"}),
              R(Op::kWait, {"//worker/attempt_0/1"}), R(Op::kGet, {"//worker/attempt_0/1"}),
              R(Op::kCompareSet, {"/cas"}, {"old", "new"}), R(Op::kGetNumKeys),
              R(Op::kDeleteKey, {"/cas"})}));
  for (const auto& [name, bytes] : seeds) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
