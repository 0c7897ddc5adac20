// The [sdk] tier, continued: the SDK's other two front ends as users run them
// under the real ddprun.
//  - The Python module (worker_sdk/python/ddprun_sdk.py, as the build copies it
//    to build/python) driven by tests/sdk/python/sdk_module_check.py at 1 and
//    3 ranks, over shared memory and over Gloo's TCP path (DDP_SHM=0), and
//    outside ddprun; examples/train_mlp_sdk.py at 2 ranks.
//  - The C API from a C program (tests/sdk/worker/c_api_worker.c) at 2 ranks
//    and outside ddprun.
// The Python interpreter is /usr/bin/python3 (numpy; torch is optional: the
// script skips its torch part visibly without it).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";

std::string CheckScript() {
  return std::string(DDPRUN_SOURCE_DIR) + "/tests/sdk/python/sdk_module_check.py";
}

// The environment of a Python worker: the build's module (which finds the
// build's library itself: DDPRUN_SDK_LIB is cleared), host buffers on Gloo.
EnvList PythonEnv(const std::string& shm = "1") {
  return {{"PYTHON_EXEC", kPython},        {"PYTHONPATH", DDPRUN_PYTHON_DIR},
          {"DDPRUN_SDK_LIB", ""},          {"DDP_BACKEND", "gloo"},
          {"DDP_TIMEOUT_SEC", "30"},       {"DDP_SHM", shm},
          {"PYTHONDONTWRITEBYTECODE", "1"}};
}

// Whether /usr/bin/python3 can import numpy; if not, the case is skipped
// (support/skip.h: every [python] case needs numpy, and they run as their own
// CTest test, sdk_python_tests).
bool HaveNumpy() {
  static const bool ok = std::system((kPython + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
  if (!ok) SkipCase("sdk", kPython + " cannot import numpy; install python3-numpy");
  return ok;
}

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("Python module under ddprun: collectives, Reducer, torch tensors, bad input",
          "[sdk][python]") {
  if (!HaveNumpy()) return;
  struct Case {
    int ranks;
    const char* shm;
  };
  for (const Case& c : {Case{1, "1"}, Case{3, "1"}, Case{3, "0"}}) {
    DYNAMIC_SECTION(c.ranks << " rank(s), " << (std::string(c.shm) == "1" ? "shm" : "tcp")) {
      Harness h;
      EnvList env = PythonEnv(c.shm);
      env.push_back({"SDK_CHECK_DIR", h.dir()});
      env.push_back({"SDK_EXPECT_TCPSTORE", "1"});  // one node: ddprun's TCPStore, no gRPC
      Proc& p = h.StartDdprun("ddprun",
                              {"--nproc_per_node=" + std::to_string(c.ranks), CheckScript()}, env);
      const int rc = h.Wait(p, 120);
      const std::string out = p.Out();
      INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
      CHECK_FALSE(Contains(out, "FAIL"));
      REQUIRE(rc == 0);
      for (int r = 0; r < c.ranks; ++r)
        REQUIRE(Contains(out, "rank " + std::to_string(r) + ": all checks passed"));
      if (Contains(out, "SKIPPED torch")) {
        WARN("the torch part was skipped: " << kPython << " cannot import torch");
      } else {
        REQUIRE(Contains(out, "rank 0: torch "));
      }
    }
  }
}

TEST_CASE(
    "Python module under --restart_policy=inplace: PeerLostError, then reconfigure(pg) "
    "in the same process",
    "[sdk][python]") {
  if (!HaveNumpy()) return;
  for (const char* shm : {"1", "0"}) {
    DYNAMIC_SECTION((std::string(shm) == "1" ? "shm" : "tcp")) {
      Harness h;
      EnvList env = PythonEnv(shm);
      const std::string out = h.dir() + "/reform";
      env.push_back({"REFORM_OUT", out});
      Proc& p =
          h.StartDdprun("ddprun",
                        {"--nproc_per_node=4", "--restart_policy=inplace", "--max_restarts=3",
                         std::string(DDPRUN_SOURCE_DIR) + "/tests/sdk/python/reform_check.py"},
                        env);
      const int rc = h.Wait(p, 180);
      INFO("stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
      REQUIRE(rc == 0);
      for (int r = 0; r < 4; ++r) {
        const std::string report = ReadFile(out + "." + std::to_string(r));
        INFO("rank " << r << ": " << report);
        REQUIRE(Contains(report, " sum=10 "));
        REQUIRE_FALSE(Contains(report, " round=0 "));
        if (r != 2) {
          REQUIRE(Contains(report, "lost=8 "));  // PeerLostError's code
          const double ms = std::stod(report.substr(report.find("lost=8 ") + 7));
          REQUIRE(ms < 2000);
        }
      }
    }
  }
}

TEST_CASE("Python module outside ddprun: init() names DDPRUN_STORE_ADDR", "[sdk][python]") {
  if (!HaveNumpy()) return;
  Harness h;
  EnvList env = PythonEnv();
  env.push_back({"DDPRUN_STORE_ADDR", ""});
  env.push_back({"RANK", ""});
  Proc& p = h.Start("bare", {kPython, CheckScript(), "--outside"}, env);
  const int rc = h.Wait(p, 30);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  REQUIRE(Contains(out, "DDPRUN_STORE_ADDR is not set"));
  REQUIRE(Contains(out, "ddprun --nproc_per_node=2 ./trainer"));
  REQUIRE(Contains(out, "outside ddprun: all checks passed"));
}

TEST_CASE("examples/train_mlp_sdk.py at 2 ranks: the loss falls, replicas agree", "[sdk][python]") {
  if (!HaveNumpy()) return;
  Harness h;
  Proc& p = h.StartDdprun(
      "ddprun",
      {"--nproc_per_node=2", std::string(DDPRUN_SOURCE_DIR) + "/examples/train_mlp_sdk.py"},
      PythonEnv());
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  REQUIRE(Contains(out, "weights identical on all 2 ranks: True"));
  REQUIRE(Contains(out, "epoch 4: loss "));
  // "loss <first epoch> -> <last epoch>; ..."
  const std::size_t at = out.find("\nloss ");
  REQUIRE(at != std::string::npos);
  const std::size_t arrow = out.find(" -> ", at);
  REQUIRE(arrow != std::string::npos);
  const double first = std::stod(out.substr(at + 6, arrow - at - 6));
  const double last = std::stod(out.substr(arrow + 4));
  INFO("loss " << first << " -> " << last);
  REQUIRE(last < first / 100);
}

TEST_CASE("C API from a C program at 2 ranks", "[sdk][c-api]") {
  Harness h;
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--no_python", Bin("c_api_worker")},
                          {{"DDP_BACKEND", "gloo"}, {"DDP_TIMEOUT_SEC", "30"}});
  const int rc = h.Wait(p, 60);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  CHECK_FALSE(Contains(out, "FAIL"));
  REQUIRE(rc == 0);
  REQUIRE(Contains(out, "rank 0: all C API checks passed"));
  REQUIRE(Contains(out, "rank 1: all C API checks passed"));
}

TEST_CASE("C API outside ddprun: ddp_init returns invalid argument naming DDPRUN_STORE_ADDR",
          "[sdk][c-api]") {
  Harness h;
  Proc& p = h.Start("bare", {Bin("c_api_worker"), "--outside"},
                    {{"DDPRUN_STORE_ADDR", ""}, {"RANK", ""}});
  const int rc = h.Wait(p, 30);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  REQUIRE(Contains(out, "invalid argument: ddp::Init: DDPRUN_STORE_ADDR is not set"));
  REQUIRE(Contains(out, "outside ddprun: all C API checks passed"));
}
