// The failure report: torchelastic's error file (@record JSON, read with
// nlohmann-json), the per-failure details and the whole block, and which
// workers count as failed (a WorkerGroup over the fake launcher).
#include "ddprun/agent/failure_report.h"

#include <signal.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent_fakes.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/ddprun_reporttest_XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST_CASE("error file: torchelastic's @record JSON", "[unit]") {
  CHECK(ParseErrorFileMessage(
            R"({"message": {"message": "ValueError: bad \"x\"\nline2", "extraInfo": )"
            R"({"py_callstack": "Traceback ...\n  File \"t.py\"", "timestamp": "1700000000"}}})") ==
        "ValueError: bad \"x\"\nline2");
  CHECK(ParseErrorFileMessage(R"({"message": "plain", "errorCode": 1})") == "plain");
  CHECK(ParseErrorFileMessage(
            R"( { "other": [1, 2, {"a": null}], "message" : "caf\u00e9 \ud83d\ude00" } )") ==
        "caf\xc3\xa9 \xf0\x9f\x98\x80");
  CHECK_FALSE(ParseErrorFileMessage("not json").has_value());
  CHECK_FALSE(ParseErrorFileMessage(R"({"message": {"message": )").has_value());  // truncated
  CHECK_FALSE(ParseErrorFileMessage(R"({"nomessage": 1})").has_value());

  TempDir d;
  const std::string f = d.path + "/error.json";
  std::ofstream(f)
      << R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": ")"
      << std::string(100000, 'x') << R"(", "timestamp": "1"}}})";
  CHECK(ReadErrorMessage(f) == "RuntimeError: boom");  // a long traceback does not hide it
  std::ofstream(f) << "oops, not json\n";
  CHECK(ReadErrorMessage(f) == "oops, not json");
  CHECK(ReadErrorMessage(d.path + "/missing.json").empty());
  CHECK(ReadErrorMessage("").empty());
}

// As torch 2.11's torchrun wrote its own TORCHELASTIC_ERROR_FILE on a GPU
// machine (tests/gpu/torchrun_side_by_side.py): the root cause's @record
// JSON with message.errorCode added.
TEST_CASE("the launcher's TORCHELASTIC_ERROR_FILE: torchrun's root-cause JSON", "[unit]") {
  rendezvous::WorkerFailure f;
  f.host = "n1";
  f.global_rank = 1;
  f.local_rank = 1;
  f.exit_code = 1;
  f.timestamp = 1700000000.5;
  f.error_message = "ValueError: boom";
  f.stderr_tail = "Traceback ...\nValueError: boom";
  const std::string record =
      R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}})";
  nlohmann::json j = nlohmann::json::parse(LauncherErrorFileJson(f, record));
  CHECK(j["message"]["message"] == "ValueError: boom");
  CHECK(j["message"]["extraInfo"]["py_callstack"] == "tb");
  CHECK(j["message"]["errorCode"] == 1);
  // No error file (another node's worker, or none written): built from the report.
  f.signal = 9;
  f.exit_code = 0;
  j = nlohmann::json::parse(LauncherErrorFileJson(f, ""));
  CHECK(j["message"]["message"] == "ValueError: boom");
  CHECK(j["message"]["extraInfo"]["py_callstack"] == "Traceback ...\nValueError: boom");
  CHECK(j["message"]["extraInfo"]["timestamp"] == "1700000000");
  CHECK(j["message"]["errorCode"] == -9);
  f.error_message.clear();
  j = nlohmann::json::parse(LauncherErrorFileJson(f, "not json"));
  CHECK(j["message"]["message"] ==
        "worker rank 1 (local rank 1) on n1 exited with signal SIGKILL (9)");
  // ParseErrorFileMessage reads it back as any error file.
  CHECK(ParseErrorFileMessage(LauncherErrorFileJson(f, "")) == j["message"]["message"]);
}

TEST_CASE("failure details: error message, log file, stderr tail", "[unit]") {
  rendezvous::WorkerFailure f;
  CHECK(FormatFailureDetails(f).empty());
  f.error_message = "ValueError: x\ny";
  f.log_file = "/l/job/attempt_0/1/stderr.log";
  f.stderr_tail = "Traceback\n  boom";
  CHECK(FormatFailureDetails(f) ==
        "ddprun:   error: ValueError: x y\n"
        "ddprun:   log: /l/job/attempt_0/1/stderr.log\n"
        "ddprun:   stderr (last 2 lines):\n"
        "ddprun:   | Traceback\n"
        "ddprun:   |   boom\n");
}

TEST_CASE("a ModuleNotFoundError points the report at the workers' interpreter", "[unit]") {
  rendezvous::WorkerFailure f;
  f.stderr_tail =
      "Traceback (most recent call last):\n  File \"train.py\", line 1\n"
      "ModuleNotFoundError: No module named 'torch.distributed'";
  const std::string hint = MissingModuleHint({f}, "python3");
  CHECK(hint ==
        "ddprun:   the workers' Python (python3) cannot import 'torch.distributed'; set "
        "PYTHON_EXEC to an interpreter that has it (Debian's PyTorch: "
        "PYTHON_EXEC=/usr/bin/python3), or install torch for python3; `ddprun check` tests "
        "this before a job starts\n");
  f.stderr_tail = "RuntimeError: CUDA error";
  CHECK(MissingModuleHint({f}, "python3").empty());
  f.error_message = "ModuleNotFoundError: No module named 'numpy'";
  CHECK_THAT(MissingModuleHint({f}, "/opt/py/bin/python"),
             Catch::Contains("(/opt/py/bin/python) cannot import 'numpy'"));
}

TEST_CASE("job failure block: reason, first failure first, details", "[unit]") {
  rendezvous::WorkerFailure a;
  a.host = "n1";
  a.global_rank = 3;
  a.local_rank = 1;
  a.exit_code = 7;
  a.pid = 42;
  a.round = 2;
  a.error_message = "boom";
  rendezvous::WorkerFailure b = a;
  b.global_rank = 2;
  b.local_rank = 0;
  b.exit_code = 0;
  b.signal = SIGSEGV;
  b.error_message.clear();
  CHECK(FormatJobFailure("j1", "budget spent", {a, b}) ==
        "ddprun: job j1 failed: budget spent\n"
        "ddprun: job j1 failed: worker rank 3 (local rank 1) on n1 exited with exit code 7 "
        "(pid 42, round 2; first failure)\n"
        "ddprun:   error: boom\n"
        "ddprun: job j1 failed: worker rank 2 (local rank 0) on n1 exited with signal SIGSEGV "
        "(11) (pid 42, round 2)\n");
}

TEST_CASE("failures: workers the agent stopped do not count, earliest exit first", "[unit]") {
  testing::SimWorld world;
  WorkerGroup group(world.launcher, world.clock);
  SpawnSpec spec;
  spec.env = {{"LOCAL_RANK", "0"}, {"TORCHELASTIC_RESTART_COUNT", "0"}};
  world.script = [](int index, int, int) -> absl::StatusOr<testing::Behaviour> {
    if (index == 0) return testing::Runs();
    return testing::ExitsAfter(index == 1 ? 200 : 100, 3);
  };
  for (int j = 0; j < 3; ++j) REQUIRE(group.Spawn(j, 10 + j, spec, "", absl::OkStatus()).ok());
  REQUIRE_FALSE(group.Spawn(3, 13, spec, "", absl::NotFoundError("no such program")).ok());
  world.clock.Advance(std::chrono::milliseconds(150));
  group.Poll();  // rank 12 exited at 100 ms
  world.clock.Advance(std::chrono::milliseconds(150));
  group.Poll();                                  // rank 11 at 200 ms
  group.Signal(SIGTERM, /*mark_stopped=*/true);  // only rank 10 was still running
  group.Poll();
  CHECK_FALSE(group.AnyAlive());
  WorkerLogs::Options lo;
  lo.log_dir = "";
  WorkerLogs logs(lo);
  REQUIRE(logs.Init().ok());
  auto failures = CollectFailures(group, "h", 4, logs);
  REQUIRE(failures.size() == 3);
  // The spawn failure was recorded at once, the exits when they were seen.
  CHECK(failures[0].global_rank == 13);
  CHECK(failures[0].exit_code == 127);
  CHECK(failures[0].error_message == "no such program");
  CHECK(failures[1].global_rank == 12);
  CHECK(failures[2].global_rank == 11);
  CHECK(failures[1].round == 4);
  CHECK(failures[1].host == "h");
}

}  // namespace
}  // namespace ddprun::agent
