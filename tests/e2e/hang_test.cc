// Hang detection end to end (docs/monitoring.md): real workers under real
// ddprun agents hang on purpose; ddprun must name the culprit rank, show its
// stack (the sleeping line for a Python worker, native frames for a C++ SDK
// trainer) within --hang_timeout + 15 s, and act on --on_hang.
#include <catch2/catch.hpp>
#include <regex>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here
const std::string kHangScript = std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/hang_ddp.py";
constexpr double kHangTimeout = 4;
constexpr double kReportWithin = kHangTimeout + 15;

// `hang_ddp.py", line N in main` for the fixture's line marked HANG_LINE,
// where the culprit sleeps.
std::string HangLineFrame() {
  const std::vector<std::string> lines = Lines(ReadFile(kHangScript));
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find("# HANG_LINE") != std::string::npos) {
      return "hang_ddp.py\", line " + std::to_string(i + 1) + " in main";
    }
  }
  FAIL("no HANG_LINE in " << kHangScript);
  return "";
}

bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

// The "no rank made progress for X s" of the report: X is within the bound.
void CheckReportedInTime(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("no rank made progress for ([0-9.]+) s")));
  CHECK(std::stod(m[1]) >= kHangTimeout);
  CHECK(std::stod(m[1]) <= kReportWithin);
}

}  // namespace

TEST_CASE(
    "hang: an unmodified PyTorch DDP script whose rank 1 sleeps at step 5 is named with "
    "its sleeping line, and --on_hang=abort ends the job",
    "[e2e][hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  Proc& p = h.StartDdprun("ddprun",
                          {"--standalone", "--nproc_per_node=2", "--hang_timeout=4",
                           "--on_hang=abort", kPython, kHangScript},
                          {{"HANG_RANK", "1"}, {"HANG_AT_STEP", "5"}});
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  CHECK(rc != 0);
  CHECK_THAT(out, Catch::Contains("HANG: no rank made progress"));
  CHECK_THAT(out, Catch::Contains("culprit rank(s) 1:"));
  CHECK_THAT(out, Catch::Contains("waiting: rank(s) 0"));
  CHECK_THAT(out, Catch::Contains(HangLineFrame()));
  CHECK_THAT(out, Catch::Contains("on_hang=abort"));
  CheckReportedInTime(out);
}

TEST_CASE(
    "hang: --on_hang=restart restarts the round as the hung rank's failure, counted against "
    "--max_restarts",
    "[e2e][hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  // Rank 1 hangs in the first round only; the restarted round trains to the end.
  Proc& p = h.StartDdprun("ddprun",
                          {"--standalone", "--nproc_per_node=2", "--hang_timeout=4",
                           "--on_hang=restart", "--max_restarts=1", kPython, kHangScript},
                          {{"HANG_RANK", "1"}, {"HANG_AT_STEP", "5"}, {"HANG_RESTART", "0"}});
  const int rc = h.Wait(p, 150);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("culprit rank(s) 1:"));
  CHECK_THAT(out, Catch::Contains("on_hang=restart"));
  // The console says why the workers restart: rank 1 hung, one restart of one.
  CHECK(std::regex_search(out, std::regex("restarting the workers: rank 1 on 127\\.0\\.0\\.1 "
                                          "\\(pid [0-9]+\\) hung: no progress for "
                                          "--hang_timeout \\(see the hang report\\) "
                                          "\\(restart 1 of 1\\)")));
  CHECK(out.find("worker failure on") == std::string::npos);
  CHECK_THAT(out, Catch::Contains("restart 1"));  // the second round's start line
  CheckReportedInTime(out);
}

TEST_CASE("hang: a C++ SDK trainer whose rank 0 skips its all-reduce is named with native frames",
          "[e2e][hang]") {
  Harness h;
  Proc& p = h.StartDdprun("ddprun",
                          {"--standalone", "--nproc_per_node=2", "--hang_timeout=4",
                           "--on_hang=abort", Bin("metrics_trainer")},
                          {{"HANG_RANK", "0"}, {"HANG_AT_STEP", "5"}, {"STEPS", "1000"}});
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  CHECK(rc != 0);
  CHECK_THAT(out, Catch::Contains("culprit rank(s) 0:"));
  CHECK_THAT(out, Catch::Contains("waiting: rank(s) 1"));
  // gdb's frames of the culprit (native), or why there are none.
  CHECK_THAT(out, Catch::Contains("native") || Catch::Contains("kernel"));
  CheckReportedInTime(out);
}

TEST_CASE(
    "hang: on two nodes through ddprund, the culprit on the second node is named on both "
    "consoles and --on_hang=abort ends both agents",
    "[e2e][hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  auto agent = [&](const std::string& name, const std::string& addr) -> Proc& {
    return h.StartDdprun(
        name,
        {"--nnodes=2", "--nproc_per_node=2", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
         "--rdzv_id=e2e-hang", "--local_addr=" + addr, "--hang_timeout=4", "--on_hang=abort",
         kPython, kHangScript},
        {{"HANG_RANK", "3"}, {"HANG_AT_STEP", "5"}});
  };
  Proc& a = agent("a", "127.0.0.1");
  Proc& b = agent("b", "127.0.0.2");
  const int ra = h.Wait(a, 150);
  const int rb = h.Wait(b, 150);
  const std::string out_a = a.Out() + a.Err(), out_b = b.Out() + b.Err();
  INFO("node a:\n" << out_a << "\nnode b:\n" << out_b);
  CHECK(ra != 0);
  CHECK(rb != 0);
  for (const std::string& out : {out_a, out_b}) {
    CHECK_THAT(out, Catch::Contains("culprit rank(s) 3:"));
    CHECK_THAT(out, Catch::Contains(HangLineFrame()));
  }
  CheckReportedInTime(out_a);
  h.StopDaemon(*daemon);
}
