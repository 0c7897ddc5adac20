// [unit] tests of the worker SDK: bucket assignment, half conversions,
// environment parsing and the C API's argument checks (no sockets).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ddp/c_api.h"
#include "ddp/ddp.h"
#include "ddp/half.h"

using ddp::ComputeBucketAssignment;
using ddp::DType;
using ddp::GradSpec;
using Buckets = std::vector<std::vector<std::size_t>>;

namespace {
std::vector<GradSpec> F32(const std::vector<std::size_t>& counts) {
  std::vector<GradSpec> out;
  for (std::size_t c : counts) out.push_back(GradSpec{nullptr, c, DType::kFloat32, {}});
  return out;
}
constexpr std::size_t KiB = 1024;
}  // namespace

TEST_CASE("buckets fill in reverse registration order up to the cap", "[unit]") {
  // 4 bytes per value: tensors of 1, 2, 3, 4 KiB.
  auto g = F32({256, 512, 768, 1024});
  REQUIRE(ComputeBucketAssignment(g, 4 * KiB, 4 * KiB) == Buckets{{3}, {2, 1}, {0}});
  REQUIRE(ComputeBucketAssignment(g, 100 * KiB, 100 * KiB) == Buckets{{3, 2, 1, 0}});
  // A bucket closes once it reaches the cap, so it may exceed it by one tensor.
  REQUIRE(ComputeBucketAssignment(g, 5 * KiB, 5 * KiB) == Buckets{{3, 2}, {1, 0}});
}

TEST_CASE("the first bucket uses first_bucket_bytes, later ones the cap", "[unit]") {
  auto g = F32(std::vector<std::size_t>(10, 256));  // ten 1 KiB tensors
  REQUIRE(ComputeBucketAssignment(g, 1 * KiB, 4 * KiB) ==
          Buckets{{9}, {8, 7, 6, 5}, {4, 3, 2, 1}, {0}});
  // The defaults: 1 MiB then 25 MiB.
  auto resnet_like = F32(std::vector<std::size_t>(100, 1 << 18));  // 1 MiB each
  auto b = ComputeBucketAssignment(resnet_like, ddp::kDefaultFirstBucketBytes,
                                   ddp::kDefaultBucketBytesCap);
  REQUIRE(b.size() == 5);  // 1 + 25 + 25 + 25 + 24
  REQUIRE(b[0] == std::vector<std::size_t>{99});
  REQUIRE(b[1].size() == 25);
  REQUIRE(b[4].size() == 24);
}

TEST_CASE("buckets never mix dtypes", "[unit]") {
  std::vector<GradSpec> g = F32({256, 256, 256, 256});
  g[1].dtype = DType::kFloat64;  // 256 x 8 = 2 KiB
  g[3].dtype = DType::kFloat64;
  const auto b = ComputeBucketAssignment(g, 64 * KiB, 64 * KiB);
  // Ordered by when each dtype's bucket opened: f64 (tensor 3) first.
  REQUIRE(b == Buckets{{3, 1}, {2, 0}});
}

TEST_CASE("every gradient is in exactly one bucket", "[unit]") {
  const std::size_t cap = GENERATE(1, 1000, 4096, 1 << 20);
  std::vector<std::size_t> counts;
  for (std::size_t i = 0; i < 161; ++i) counts.push_back((i * 7919) % 20000 + (i % 3 == 0 ? 0 : 1));
  auto g = F32(counts);
  for (std::size_t i = 0; i < g.size(); i += 5) g[i].dtype = DType::kFloat16;
  const auto b = ComputeBucketAssignment(g, cap / 2 + 1, cap);
  std::vector<int> seen(g.size(), 0);
  for (const auto& bucket : b) {
    REQUIRE(!bucket.empty());
    for (std::size_t k = 0; k < bucket.size(); ++k) {
      ++seen[bucket[k]];
      REQUIRE(g[bucket[k]].dtype == g[bucket[0]].dtype);
      if (k > 0) REQUIRE(bucket[k] < bucket[k - 1]);
    }
  }
  for (int s : seen) REQUIRE(s == 1);
}

TEST_CASE("float16 and bfloat16 round to nearest even", "[unit]") {
  using namespace ddp::detail;
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f, 1000.5f}) {
    REQUIRE(Float16ToFloat(FloatToFloat16(f)) == f);
  }
  REQUIRE(FloatToFloat16(1.0f) == 0x3c00);
  REQUIRE(FloatToFloat16(65520.0f) == 0x7c00);          // overflows to inf
  REQUIRE(FloatToFloat16(1.0f + 1.0f / 2048) == 0x3c00);  // tie to even (down)
  REQUIRE(FloatToFloat16(1.0f + 3.0f / 2048) == 0x3c02);  // tie to even (up)
  REQUIRE(std::isnan(Float16ToFloat(FloatToFloat16(NAN))));
  REQUIRE(Float16ToFloat(FloatToFloat16(1e-9f)) == 0.0f);
  REQUIRE(Float16ToFloat(FloatToFloat16(3e-8f)) == 5.9604645e-08f);  // rounds up to the smallest subnormal
  REQUIRE(FloatToBFloat16(1.0f) == 0x3f80);
  REQUIRE(BFloat16ToFloat(FloatToBFloat16(3.0f)) == 3.0f);
  REQUIRE(FloatToBFloat16(1.0f + 1.0f / 256) == 0x3f80);  // tie to even
  // Every finite f16 survives a round trip through float.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    REQUIRE(FloatToFloat16(Float16ToFloat(std::uint16_t(h))) == h);
  }
}

namespace {
// Sets (or clears, for nullptr) environment variables for one test.
struct EnvScope {
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset;
  void Set(const char* k, const char* v) {
    if (const char* old = std::getenv(k)) saved.emplace_back(k, old);
    else unset.push_back(k);
    if (v) ::setenv(k, v, 1);
    else ::unsetenv(k);
  }
  ~EnvScope() {
    for (auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
    for (auto& k : unset) ::unsetenv(k.c_str());
  }
};
void SetGood(EnvScope& e) {
  e.Set("DDPRUN_STORE_ADDR", "127.0.0.1:1");
  e.Set("DDPRUN_JOB_ID", "job1");
  e.Set("DDPRUN_ROUND", "3");
  e.Set("DDPRUN_TOKEN", "t");
  e.Set("DDPRUN_HOST", "127.0.0.1");
  e.Set("RANK", "1");
  e.Set("WORLD_SIZE", "4");
  e.Set("LOCAL_RANK", "1");
  e.Set("LOCAL_WORLD_SIZE", "4");
}
}  // namespace

TEST_CASE("the worker environment: parsed, or a clear error", "[unit]") {
  EnvScope e;
  SetGood(e);
  const ddp::WorkerInfo info = ddp::ReadWorkerEnvironment();
  REQUIRE(info.rank == 1);
  REQUIRE(info.world_size == 4);
  REQUIRE(info.round == 3);
  REQUIRE(info.job_id == "job1");

  SECTION("outside ddprun") {
    e.Set("DDPRUN_STORE_ADDR", nullptr);
    REQUIRE_THROWS_WITH(ddp::ReadWorkerEnvironment(),
                        Catch::Contains("DDPRUN_STORE_ADDR is not set") &&
                            Catch::Contains("not started by ddprun") &&
                            Catch::Contains("ddprun --nproc_per_node=2 ./trainer"));
    REQUIRE_THROWS_AS(ddp::Init(), ddp::InvalidArgumentError);
  }
  SECTION("garbled") {
    e.Set("RANK", "one");
    REQUIRE_THROWS_WITH(ddp::ReadWorkerEnvironment(), Catch::Contains("RANK='one'"));
  }
  SECTION("rank out of range") {
    e.Set("RANK", "4");
    REQUIRE_THROWS_WITH(ddp::ReadWorkerEnvironment(), Catch::Contains("not below WORLD_SIZE=4"));
  }
  SECTION("bad store address") {
    e.Set("DDPRUN_STORE_ADDR", "nowhere");
    REQUIRE_THROWS_WITH(ddp::ReadWorkerEnvironment(), Catch::Contains("is not host:port"));
    // Parsed by host_port.h like every endpoint: port 0 is no store's port.
    e.Set("DDPRUN_STORE_ADDR", "127.0.0.1:0");
    REQUIRE_THROWS_WITH(ddp::ReadWorkerEnvironment(),
                        Catch::Contains("DDPRUN_STORE_ADDR='127.0.0.1:0' is not host:port ("));
  }
  SECTION("an IPv6 store address in brackets") {
    e.Set("DDPRUN_STORE_ADDR", "[::1]:29400");
    REQUIRE(ddp::ReadWorkerEnvironment().store_addr == "[::1]:29400");
  }
  SECTION("C API: the same error, as a code and a message") {
    e.Set("DDPRUN_TOKEN", nullptr);
    ddp_group_t* g = reinterpret_cast<ddp_group_t*>(1);
    REQUIRE(ddp_init(nullptr, &g) == DDP_ERR_INVALID_ARGUMENT);
    REQUIRE(g == nullptr);
    REQUIRE(std::string(ddp_last_error()).find("DDPRUN_TOKEN is not set") != std::string::npos);
  }
}

TEST_CASE("C API: null handles, bad enums", "[unit]") {
  REQUIRE(ddp_abi_version() == DDP_ABI_VERSION);
  float x = 0;
  REQUIRE(ddp_allreduce(nullptr, &x, 1, DDP_FLOAT32, DDP_SUM, nullptr) ==
          DDP_ERR_INVALID_ARGUMENT);
  REQUIRE(std::string(ddp_last_error()).find("null") != std::string::npos);
  REQUIRE(ddp_init(nullptr, nullptr) == DDP_ERR_INVALID_ARGUMENT);
  REQUIRE(ddp_reducer_mark_ready(nullptr, 0) == DDP_ERR_INVALID_ARGUMENT);
  REQUIRE(ddp_work_wait(nullptr, 0) == DDP_ERR_INVALID_ARGUMENT);
  REQUIRE(std::string(ddp_status_name(DDP_ERR_TIMEOUT)) == "timeout");
}

TEST_CASE("errors map to one hierarchy", "[unit]") {
  try {
    throw ddp::TimeoutError("x");
  } catch (const ddp::Error& e) {
    REQUIRE(e.code() == ddp::ErrorCode::kTimeout);
  }
  REQUIRE(ddp::DTypeSize(DType::kBFloat16) == 2);
  REQUIRE(std::string(ddp::DTypeName(DType::kInt64)) == "i64");
}
