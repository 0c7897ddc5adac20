// The worker SDK's DDP_* variables (sdk_env.h): unset means every default,
// good values parse, and a bad value is one line naming the variable, what
// it must be and the fix. docs/sdk.md shows every row with its default.
#include "sdk_env.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "shm_group.h"

namespace ddp::detail {
namespace {

using Env = std::map<std::string, std::string>;

absl::StatusOr<SdkEnv> Read(const Env& env) {
  return ReadSdkEnv([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string Error(const Env& env) {
  auto r = Read(env);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("sdk env: nothing set, or set empty, leaves every default", "[unit]") {
  for (const Env& env : {Env{}, Env{{"DDP_SHM_CHUNK", ""}, {"DDP_BACKEND", ""}}}) {
    auto r = Read(env);
    REQUIRE(r.ok());
    CHECK_FALSE(r->timeout.has_value());
    CHECK_FALSE(r->backend.has_value());
    CHECK_FALSE(r->shared_memory.has_value());
    CHECK(r->shm_chunk_bytes == kDefaultShmChunkBytes);
    CHECK(r->shm_host_id.empty());
    CHECK(r->nccl_library.empty());
  }
}

TEST_CASE("sdk env: good values", "[unit]") {
  auto r = Read({{"DDP_TIMEOUT_SEC", "2.5"},
                 {"DDP_BACKEND", "gloo"},
                 {"DDP_SHM", "0"},
                 {"DDP_SHM_CHUNK", "65536"},
                 {"DDP_SHM_HOST_ID", "hostA"},
                 {"DDP_NCCL_LIBRARY", "/opt/nccl/lib/libnccl.so.2"}});
  REQUIRE(r.ok());
  CHECK(r->timeout == Duration(2500));
  CHECK(r->backend == ddp::Backend::kGloo);
  CHECK(r->shared_memory == false);
  CHECK(r->shm_chunk_bytes == 65536);
  CHECK(r->shm_host_id == "hostA");
  CHECK(r->nccl_library == "/opt/nccl/lib/libnccl.so.2");
  CHECK(Read({{"DDP_BACKEND", "nccl"}})->backend == ddp::Backend::kNccl);
  CHECK(Read({{"DDP_BACKEND", "auto"}})->backend == ddp::Backend::kAuto);
  CHECK(Read({{"DDP_SHM", "1"}})->shared_memory == true);
}

TEST_CASE("sdk env: a bad value is one line naming the variable and the fix", "[unit]") {
  CHECK(Error({{"DDP_SHM_CHUNK", "abc"}}) ==
        "DDP_SHM_CHUNK='abc' is not a number of bytes in 4096..67108864; write bytes, or unset "
        "it for the default, 1048576 (it is for tuning only)");
  CHECK(Error({{"DDP_SHM_CHUNK", "0"}}).rfind("DDP_SHM_CHUNK='0' is not a number of bytes", 0) ==
        0);
  CHECK(Error({{"DDP_SHM_CHUNK", "-1"}}).rfind("DDP_SHM_CHUNK='-1' is not", 0) == 0);
  CHECK(Error({{"DDP_SHM_CHUNK", "4k"}}).rfind("DDP_SHM_CHUNK='4k' is not", 0) == 0);
  CHECK(Error({{"DDP_SHM_CHUNK", "1073741824"}}).rfind("DDP_SHM_CHUNK='1073741824' is not", 0) ==
        0);
  CHECK(Error({{"DDP_TIMEOUT_SEC", "0"}}) ==
        "DDP_TIMEOUT_SEC='0' is not a positive number of seconds; write seconds, e.g. 60, or "
        "unset it for the default");
  CHECK(Error({{"DDP_TIMEOUT_SEC", "x"}}).rfind("DDP_TIMEOUT_SEC='x' is not", 0) == 0);
  CHECK(Error({{"DDP_TIMEOUT_SEC", "inf"}}).rfind("DDP_TIMEOUT_SEC='inf' is not", 0) == 0);
  CHECK(Error({{"DDP_BACKEND", "mpi"}}) ==
        "DDP_BACKEND='mpi' is not one of auto, gloo, nccl; write one of them, or unset it");
  CHECK(Error({{"DDP_SHM", "yes"}}) ==
        "DDP_SHM='yes' is not 0 (TCP only) or 1 (shared memory); write 0 or 1, or unset it");
  for (const Env& env : {Env{{"DDP_SHM_CHUNK", "abc"}}, Env{{"DDP_BACKEND", "mpi"}}}) {
    CHECK(Error(env).find('\n') == std::string::npos);
  }
}

TEST_CASE("sdk env: docs/sdk.md shows every variable with its default", "[unit]") {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/docs/sdk.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::size_t start = doc.find("| Variable | Type | Default | Meaning |");
  REQUIRE(start != std::string::npos);
  for (const SdkEnvVar& v : SdkEnvVars()) {
    INFO(v.name);
    const std::size_t row = doc.find(std::string("| `") + v.name + "` |", start);
    REQUIRE(row != std::string::npos);
    const std::string line = doc.substr(row, doc.find('\n', row) - row);
    CHECK(line.find(v.default_text) != std::string::npos);
  }
}

}  // namespace
}  // namespace ddp::detail
