// A hang before the first step (issue 33, item 000; docs/monitoring.md): an
// unmodified PyTorch script whose rank 1 never reaches init_process_group
// while rank 0 waits inside it. ddprun hosts the store they bootstrap
// through, so after --hang_timeout it names rank 1 as never having reached
// the store, rank 0 as waiting there, with rank 1's stack. A rank merely slow
// to start, that reaches the store in time, is not hung. Real torch (gloo).
#include <catch2/catch.hpp>
#include <csignal>
#include <regex>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here
const std::string kScript = std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/hang_before_init.py";

bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

// `hang_before_init.py", line N in main` for the line marked NEVER_INIT_LINE.
std::string NeverInitFrame() {
  const std::vector<std::string> lines = Lines(ReadFile(kScript));
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find("# NEVER_INIT_LINE") != std::string::npos) {
      return "hang_before_init.py\", line " + std::to_string(i + 1) + " in main";
    }
  }
  FAIL("no NEVER_INIT_LINE in " << kScript);
  return "";
}

}  // namespace

TEST_CASE(
    "startup hang: rank 1 never reaches init_process_group while rank 0 waits in it; "
    "ddprun names both, with rank 1's stack, after --hang_timeout",
    "[e2e][hang][startup_hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  // The reproduction: `ddprun --nproc_per_node=2 --hang_timeout=5 w2.py`.
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--hang_timeout=5", kPython, kScript});
  const auto t0 = Clock::now();
  std::string out;
  while (SecondsSince(t0) < 40) {
    out = p.Out() + p.Err();
    if (out.find("on_hang=report") != std::string::npos) break;  // the report's last line
    SleepMs(100);
  }
  const double took = SecondsSince(t0);
  INFO(out);
  REQUIRE_THAT(out, Catch::Contains("HANG: no rank made a first step for "));
  CHECK(took < 5 + 20);  // torch's own wait is 30 minutes
  CHECK_THAT(out, Catch::Contains("culprit rank(s) 1: never reached the round's store"));
  CHECK_THAT(out, Catch::Contains("while rank(s) 0 wait there for key(s) "));
  CHECK(std::regex_search(out, std::regex("behind:  rank 1 on [^ ]+ pid [0-9]+, step 0, never "
                                          "reached the store")));
  CHECK_THAT(out, Catch::Contains("waiting: rank(s) 0 (rank 0 at step 0, in the store)"));
  CHECK_THAT(out, Catch::Contains(NeverInitFrame()));
  // --on_hang=report stops nothing: the job still runs until told to stop.
  CHECK_FALSE(p.exit.has_value());
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  h.Wait(p, 30);
}

TEST_CASE("startup hang: --on_hang=abort ends a job whose rank never reaches the store",
          "[e2e][hang][startup_hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", "--hang_timeout=5", "--on_hang=abort", kPython, kScript});
  const int rc = h.Wait(p, 60);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  CHECK(rc != 0);
  CHECK_THAT(out, Catch::Contains("culprit rank(s) 1: never reached the round's store"));
  CHECK_THAT(out, Catch::Contains("on_hang=abort"));
}

TEST_CASE("startup hang: a rank slow to start that reaches the store in time is not hung",
          "[e2e][hang][startup_hang]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--hang_timeout=6", kPython, kScript},
                          {{"START_DELAY_S", "2"}});
  const int rc = h.Wait(p, 60);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("HANG") == std::string::npos);
}
