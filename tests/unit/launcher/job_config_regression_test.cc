// Inputs the job-file fuzzer (tests/fuzz/job_config_fuzz.cc) found, kept as
// unit tests: each must fail with a one-line error, promptly.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "ddprun/launcher/job_config.h"

namespace ddprun::launcher {
namespace {

// yaml-cpp 0.7's LoadAll loops forever (allocating) on these.
TEST_CASE("job file: tokens that make yaml-cpp's LoadAll loop are a syntax error", "[unit]") {
  const auto start = std::chrono::steady_clock::now();
  auto config = ParseJobConfig(",\n", "job.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message() ==
        "job.yaml:1:1: (syntax): ',' cannot start a value here; fix the YAML syntax");

  config = ParseJobConfig("\"a\":b\n? [c]\n", "job.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(absl::IsInvalidArgument(config.status()));
  CHECK(config.status().message().rfind("job.yaml:2:1: (syntax): ", 0) == 0);

  config = ParseJobConfig("job:\n  id: x\n---\n,\n", "job.yaml");
  REQUIRE_FALSE(config.ok());
  CHECK(config.status().message().rfind("job.yaml:", 0) == 0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

}  // namespace
}  // namespace ddprun::launcher
