// The SDK's NCCL loader (worker_sdk/src/nccl_loader.h) against real
// libraries, on a machine without a GPU: the CUDA toolkit's real
// libnccl.so.2 loads and its ncclGetVersion, called through the table, says
// the version of the header the SDK was compiled with; a library that is not
// NCCL (zlib) names the missing function and the library; a file that does
// not exist gives the line that says how to install NCCL. In a build without
// the NCCL backend (DDPRUN_WITH_CUDA off) every case skips.
#include <catch2/catch.hpp>
#include <string>

#include "support/skip.h"

#if DDPRUN_WITH_CUDA
#include "nccl_loader.h"
#endif

namespace ddp::detail {
namespace {

using ddprun::test::SkipCase;

#if DDPRUN_WITH_CUDA

TEST_CASE("nccl loader: the toolkit's libnccl.so.2 loads; ncclGetVersion is the header's",
          "[unit]") {
  const std::string library = DDPRUN_TEST_NCCL_LIBRARY;
  if (library.empty()) {
    return SkipCase("unit", "configure found no libnccl beside the CUDA toolkit");
  }
  absl::StatusOr<NcclApi> api = LoadNcclLibrary(library, "DDP_NCCL_LIBRARY");
  REQUIRE(api.ok());
  int version = 0;
  REQUIRE(api->ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  CHECK(api->version == NCCL_VERSION_CODE);
  CHECK(NcclVersionText(api->version) == std::to_string(NCCL_MAJOR) + "." +
                                             std::to_string(NCCL_MINOR) + "." +
                                             std::to_string(NCCL_PATCH));
  CHECK(api->path.find("libnccl.so") != std::string::npos);
  // A function of the table answers as NCCL does, with no device.
  CHECK(std::string(api->ncclGetErrorString(ncclInvalidArgument)).find("invalid") !=
        std::string::npos);
  // The optional ncclCommShrink is there exactly from NCCL 2.27 on, and its
  // absence never fails the load.
  CHECK((api->ncclCommShrink != nullptr) == (api->version >= 22700));
}

TEST_CASE("nccl loader: a library that is not NCCL names the missing function and the library",
          "[unit]") {
  absl::StatusOr<NcclApi> api = LoadNcclLibrary("libz.so.1", "DDP_NCCL_LIBRARY");
  REQUIRE_FALSE(api.ok());
  CHECK(api.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(api.status().message());
  INFO(message);
  CHECK(message.find("has no function ncclGetVersion") != std::string::npos);
  CHECK(message.find("libz.so.1") != std::string::npos);
  CHECK(message.find("DDP_NCCL_LIBRARY=libz.so.1") != std::string::npos);
  CHECK(message.find("point DDP_NCCL_LIBRARY at libnccl.so.2") != std::string::npos);
  CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("nccl loader: a missing file says how to install NCCL", "[unit]") {
  for (const char* from : {"", "DDP_NCCL_LIBRARY"}) {
    absl::StatusOr<NcclApi> api = LoadNcclLibrary("/nonexistent/libnccl.so.2", from);
    REQUIRE_FALSE(api.ok());
    CHECK(api.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string message(api.status().message());
    INFO(message);
    CHECK(message.rfind("the NCCL backend needs libnccl.so.2: /nonexistent/libnccl.so.2", 0) == 0);
    CHECK(message.find("install NCCL or pip install nvidia-nccl-cu12") != std::string::npos);
    CHECK(message.find("set DDP_NCCL_LIBRARY") != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}

#else

TEST_CASE("nccl loader: not built", "[unit]") {
  SkipCase("unit", "this build has no NCCL backend (DDPRUN_WITH_CUDA=OFF)");
}

#endif

}  // namespace
}  // namespace ddp::detail
