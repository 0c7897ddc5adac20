// The [sdk] tier: the worker SDK on Gloo under the real ddprun, 1-4 ranks.
// Each case runs build/bin/ddprun --nproc_per_node=N sdk_worker <filter>;
// the Catch2 checks run on every rank (tests/sdk/worker/sdk_worker.cc).
#include <catch2/catch.hpp>
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

std::string SdkWorker() { return Bin("sdk_worker"); }

// Runs the filter at world size n; requires success and prints the ranks' output.
void RunRanks(int n, const std::string& filter, double timeout_s = 240) {
  Harness h;
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=" + std::to_string(n), "--no_python",
                                     SdkWorker(), filter},
                          {{"DDP_TIMEOUT_SEC", "30"}});
  const int rc = h.Wait(p, timeout_s);
  INFO("world size " << n << ", filter " << filter << "\nstdout:\n"
                     << p.Out() << "\nstderr:\n"
                     << p.Err());
  REQUIRE(rc == 0);
}

}  // namespace

TEST_CASE("collectives match a local reference at 1-4 ranks", "[sdk]") {
  for (int n = 1; n <= 4; ++n) {
    DYNAMIC_SECTION("world size " << n) { RunRanks(n, "[collectives]"); }
  }
}

TEST_CASE("reducer at 1-4 ranks", "[sdk]") {
  for (int n = 1; n <= 4; ++n) {
    DYNAMIC_SECTION("world size " << n) { RunRanks(n, "[reducer]"); }
  }
}

TEST_CASE("bad input at 1 and 3 ranks", "[sdk]") {
  RunRanks(1, "[bad-input]");
  RunRanks(3, "[bad-input]");
}

TEST_CASE("a peer killed mid-collective: an error within the timeout, no hang", "[sdk]") {
  Harness h;
  const std::string result = h.dir() + "/result";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--grace_period=20", "--no_python",
                                     SdkWorker(), "[kill]"},
                          {{"DDP_TIMEOUT_SEC", "10"}, {"SDK_RESULT_FILE", result}});
  const int rc = h.Wait(p, 60);
  const std::string r0 = ReadFile(result + ".0");
  INFO("rank 0 reported: " << r0 << "\nddprun stderr:\n" << p.Err());
  REQUIRE(rc != 0);
  REQUIRE(r0.find("code=") != std::string::npos);
  REQUIRE(r0.find("allreduce(16777216 x f32, sum)") != std::string::npos);
  REQUIRE(r0.find("round 0") != std::string::npos);
  // Seconds until the error: well within the 10 s timeout (a closed connection).
  const double s = std::stod(r0.substr(r0.find("seconds=") + 8));
  REQUIRE(s < 10.0);
  REQUIRE(r0.find("then=") != std::string::npos);  // later calls refuse, naming the failure
}

TEST_CASE("a hung peer: a timeout error after the group timeout", "[sdk]") {
  Harness h;
  const std::string result = h.dir() + "/result";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--grace_period=5", "--no_python",
                                     SdkWorker(), "[hang]"},
                          {{"DDP_TIMEOUT_SEC", "3"}, {"SDK_RESULT_FILE", result}});
  const int rc = h.Wait(p, 60);
  const std::string r0 = ReadFile(result + ".0");
  INFO("rank 0 reported: " << r0 << "\nddprun stderr:\n" << p.Err());
  REQUIRE(rc != 0);
  REQUIRE(r0.find("code=timeout") != std::string::npos);
  REQUIRE(r0.find("round 0") != std::string::npos);
  const double s = std::stod(r0.substr(r0.find("seconds=") + 8));
  REQUIRE(s >= 2.5);
  REQUIRE(s < 10.0);
}

TEST_CASE("outside ddprun, Init says so and shows how to run", "[sdk]") {
  Harness h;
  Proc& p = h.Start("bare", {SdkWorker(), "[collectives]"},
                    {{"DDPRUN_STORE_ADDR", ""}, {"RANK", ""}});
  const int rc = h.Wait(p, 30);
  REQUIRE(rc != 0);
  const std::string all = p.Out() + p.Err();
  REQUIRE(all.find("DDPRUN_STORE_ADDR is not set") != std::string::npos);
  REQUIRE(all.find("ddprun --nproc_per_node=2 ./trainer") != std::string::npos);
}

TEST_CASE("a wrong token is refused with an auth error", "[sdk]") {
  Harness h;
  // Overriding DDPRUN_TOKEN in the launcher's environment would be replaced by
  // the agent; the worker rewrites it itself when SDK_WRONG_TOKEN is set.
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=1", "--no_python", SdkWorker(),
                                     "[wrong-token]"});
  const int rc = h.Wait(p, 60);
  INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
}
