// A persisted checkpoint file (checkpoint_file.h): a snapshot in format 1
// becomes safetensors' layout (names by key path, data without holes, the
// tree in __metadata__) and comes back byte for byte; what is not a ddprun
// file is named. Also Seed and ReadCommitted of the memory, which the
// persister uses.
#include "ddprun/agent/checkpoint_file.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "ddprun/agent/checkpoint_memory.h"
#include "nlohmann/json.hpp"

namespace ddprun::agent {
namespace {

using Json = nlohmann::json;

std::string U64(std::uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A snapshot as ddprun.checkpoint.save lays it out: {"model": {"w": f32
// [2, 2], "b": bytes}, "lr": 0.5, "np": <i2 [3]}; keys sorted as
// nlohmann writes them, so the round trip is byte-identical.
std::string Snapshot() {
  const std::string tree = Json::parse(R"({"format": 1, "state": {"t": "dict", "items": [
      ["model", {"t": "dict", "items": [
          ["w", {"t": "torch", "dtype": "float32", "shape": [2, 2], "device": "cpu",
                 "off": 0, "n": 16}],
          ["b", {"t": "bytes", "off": 64, "n": 3}]]}],
      ["lr", {"t": "v", "v": 0.5}],
      ["np", {"t": "numpy", "dtype": "<i2", "shape": [3], "off": 128, "n": 6}]]}})")
                               .dump();
  std::string s = U64(tree.size()) + tree;
  s.resize((s.size() + 63) / 64 * 64, '\0');
  const std::size_t data = s.size();
  s.resize(data + 192, '\0');
  const float w[4] = {1, 2, 3, 4};
  std::memcpy(s.data() + data, w, 16);
  std::memcpy(s.data() + data + 64, "abc", 3);
  const std::int16_t np[3] = {-1, 0, 7};
  std::memcpy(s.data() + data + 128, np, 6);
  return s;
}

std::string Assemble(const CheckpointFilePlan& plan, const std::string& snapshot) {
  std::string file = plan.head;
  for (const auto& p : plan.pieces) file += snapshot.substr(p.offset, p.size);
  return file;
}

TEST_CASE("checkpoint file: safetensors' layout, and back byte for byte", "[unit]") {
  const std::string snap = Snapshot();
  auto plan = PlanCheckpointFile(snap, 7, 1, 2);
  INFO(plan.status().message());
  REQUIRE(plan.ok());
  const std::string file = Assemble(*plan, snap);
  REQUIRE(file.size() == plan->file_size);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  CHECK(n % 8 == 0);
  const Json header = Json::parse(file.substr(8, n));
  CHECK(header["model.w"] == Json{{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}});
  CHECK(header["model.b"] == Json{{"dtype", "U8"}, {"shape", {3}}, {"data_offsets", {16, 19}}});
  CHECK(header["np"] == Json{{"dtype", "I16"}, {"shape", {3}}, {"data_offsets", {19, 25}}});
  CHECK(file.size() == 8 + n + 25);  // no holes
  const Json& meta = header["__metadata__"];
  CHECK(meta["ddprun.format"] == "1");
  CHECK(meta["ddprun.step"] == "7");
  CHECK(meta["ddprun.rank"] == "1");
  CHECK(meta["ddprun.world_size"] == "2");
  float w[4];
  std::memcpy(w, file.data() + 8 + n, 16);
  CHECK(w[3] == 4.0f);

  auto back = ParseCheckpointFile(file);
  REQUIRE(back.ok());
  CHECK(back->step == 7);
  CHECK(back->rank == 1);
  CHECK(back->world_size == 2);
  CHECK(back->snapshot == snap);
}

TEST_CASE("checkpoint file: what is not a ddprun file is named", "[unit]") {
  CHECK(ParseCheckpointFile("abc").status().message() == "not safetensors: shorter than 8 bytes");
  CHECK(ParseCheckpointFile(U64(1000) + "{}").status().message() ==
        "not safetensors: the header length is past the file's end");
  const std::string plain = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  CHECK(ParseCheckpointFile(U64(plain.size()) + plain + "abcd").status().message() ==
        "not a ddprun checkpoint: no \"ddprun.format\": \"1\" in its __metadata__");
  // A tensor's bytes cut off: its range lies outside the data.
  const std::string snap = Snapshot();
  auto plan = PlanCheckpointFile(snap, 7, 1, 2);
  REQUIRE(plan.ok());
  const std::string file = Assemble(*plan, snap);
  auto cut = ParseCheckpointFile(file.substr(0, file.size() - 3));
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().message() == "tensor 'np' lies outside the data");
  CHECK(PlanCheckpointFile("short", 1, 0, 1).status().message() ==
        "the snapshot is shorter than 8 bytes");
}

TEST_CASE("checkpoint memory: Seed commits a snapshot ReadCommitted returns", "[unit]") {
  CheckpointMemory mem(4096);
  REQUIRE(mem.Ensure(2).ok());
  const std::string snap = Snapshot();
  REQUIRE(mem.Seed(1, 9, 5, 6, snap).ok());
  CHECK(mem.Committed(0).empty());
  const auto c = mem.Committed(1);
  REQUIRE(c.size() == 1);
  CHECK(c[0].step == 9);
  CHECK(c[0].rank == 5);
  CHECK(c[0].world_size == 6);
  CHECK(mem.CommonSteps(2, 4, 6).empty());  // local rank 0 has none
  auto bytes = mem.ReadCommitted(1, c[0]);
  REQUIRE(bytes.ok());
  CHECK(*bytes == snap);
  // A record that no longer matches (saved over): kUnavailable.
  CommittedSnapshot stale = c[0];
  stale.generation += 1;
  CHECK(absl::IsUnavailable(mem.ReadCommitted(1, stale).status()));
  // Larger than the limit: named; the memory is left as it was.
  auto big = mem.Seed(1, 10, 5, 6, std::string(5000, 'x'));
  CHECK(big.message() ==
        "the snapshot of step 10 needs 5000 bytes, more than --ckpt_shm_limit (4096 bytes per "
        "worker); raise --ckpt_shm_limit");
  CHECK(mem.Committed(1).size() == 1);
  mem.Clear(1);
  CHECK(mem.Committed(1).empty());
}

}  // namespace
}  // namespace ddprun::agent
