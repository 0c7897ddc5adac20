// Checkpoints are visible (docs/checkpoint.md, "Guarantees" 5): a real
// 2-rank PyTorch job under ddprun saves a 1 MiB tensor for steps 0..6, and
// the job document (/api/v1/jobs/<job>), /metrics and `ddprun top --once`
// show, per rank, no checkpoint before the first save, then step 6, that
// snapshot's size and the checkpoint memory held.
#include <catch2/catch.hpp>
#include <fstream>
#include <optional>
#include <regex>
#include <string>

#include "e2e/checkpoint_support.h"
#include "nlohmann/json.hpp"
#include "support/http_get.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using namespace ddprun::test;
using checkpoint::kPython;
using checkpoint::TorchAvailable;
using checkpoint::WorkerEnv;
using nlohmann::json;

constexpr int kWorld = 2;
constexpr long kLastStep = 6;
constexpr double kTensorBytes = 1 << 20;

// Waits for argv[1]/go, saves steps 0..6 of a 1 MiB tensor, and waits for
// argv[1]/done (each wait 120 s at most).
constexpr const char* kScript = R"(import os, sys, time
import torch
import ddprun.checkpoint as ckpt

out, rank = sys.argv[1], int(os.environ["RANK"])
def await_file(name):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, name)):
        if time.monotonic() > deadline:
            sys.exit("no %s within 120 s" % name)
        time.sleep(0.05)
assert ckpt.load() is None
await_file("go")
for step in range(7):
    ckpt.save({"w": torch.full((262144,), float(rank + step)), "step": step}, step)
await_file("done")
)";

// The job document once `ready` holds for it (60 s at most).
template <typename Ready>
json AwaitDocument(int port, const std::string& job, Ready ready) {
  const auto t0 = Clock::now();
  json last;
  while (SecondsSince(t0) < 60) {
    auto [code, body] = Http(port, "/api/v1/jobs/" + job);
    if (code == 200) {
      last = json::parse(body);
      if (last["ranks"].size() == kWorld && ready(last)) return last;
    }
    SleepMs(100);
  }
  FAIL("the job document did not get there in 60 s: " << last.dump(1));
  return last;
}

void Touch(const std::string& path) { std::ofstream(path) << ""; }

}  // namespace

TEST_CASE(
    "checkpoint metrics: the newest step, its size and the memory held per rank in the job "
    "document, /metrics and ddprun top",
    "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string script = h.Script("save_steps.py", kScript);
  Proc& p = h.StartDdprun(
      "ddprun",
      {"--standalone", "--nproc_per_node=2", "--ckpt_shm_limit=8MiB", kPython, script, out},
      WorkerEnv());
  const int dashboard =
      std::stoi(AwaitOutput(p, std::regex("dashboard at http://127\\.0\\.0\\.1:([0-9]+)/"), 60));
  const std::string endpoint =
      AwaitOutput(p, std::regex("ddprun top --rdzv_endpoint ([0-9.:]+) "), 5);
  const std::string job = AwaitOutput(p, std::regex("--job ([A-Za-z0-9_.-]+)\\)"), 5);

  // Before the first save: no step and no size (null), whatever memory is held.
  json before = AwaitDocument(dashboard, job, [](const json& j) {
    for (const json& r : j["ranks"]) {
      if (r["state"] != "running") return false;
    }
    return true;
  });
  for (const json& r : before["ranks"]) {
    INFO(r.dump());
    CHECK(r["checkpoint_step"].is_null());
    CHECK(r["checkpoint_bytes"].is_null());
    CHECK(r["checkpoint_memory_bytes"].is_number_unsigned());
  }

  Touch(out + "/go");
  json doc = AwaitDocument(dashboard, job, [](const json& j) {
    for (const json& r : j["ranks"]) {
      if (!r["checkpoint_step"].is_number() || r["checkpoint_step"].get<long>() != kLastStep) {
        return false;
      }
    }
    return true;
  });
  INFO(doc["ranks"].dump(1));
  for (const json& r : doc["ranks"]) {
    const double bytes = r["checkpoint_bytes"].get<double>();
    CHECK(bytes > kTensorBytes);         // the tensor and the tree
    CHECK(bytes < kTensorBytes + 4096);  // nothing else
    // Both slots were written (steps 5 and 6): their pages are in use.
    CHECK(r["checkpoint_memory_bytes"].get<double>() >= 2 * bytes);
  }

  auto [code, text] = Http(dashboard, "/metrics");
  REQUIRE(code == 200);
  INFO(text);
  for (const json& r : doc["ranks"]) {
    const std::string rank = std::to_string(r["rank"].get<int>());
    auto value = [&](const std::string& family) -> std::optional<std::string> {
      std::smatch m;
      const std::regex re("\\n" + family + "\\{[^}]*rank=\"" + rank + "\"[^}]*\\} ([0-9.e+]+)\\n");
      if (!std::regex_search(text, m, re)) return std::nullopt;
      return m[1].str();
    };
    CHECK(value("ddprun_rank_checkpoint_step") == std::optional<std::string>("6"));
    const auto bytes = value("ddprun_rank_checkpoint_bytes");
    REQUIRE(bytes.has_value());
    CHECK(std::stod(*bytes) == r["checkpoint_bytes"].get<double>());
    const auto memory = value("ddprun_rank_checkpoint_memory_bytes");
    REQUIRE(memory.has_value());
    CHECK(std::stod(*memory) >= 2 * std::stod(*bytes));
  }

  Proc& top =
      h.Start("top", {Ddprun(), "top", "--rdzv_endpoint", endpoint, "--job", job, "--once"});
  REQUIRE(h.Wait(top, 30) == 0);
  INFO(top.Out());
  int rows = 0;
  for (const std::string& line : Lines(top.Out())) {
    // ... GPU_MB CKPT_STEP CKPT_MB CKMEM_MB: step 6, 1 MiB (rounded), at least 2 MiB.
    std::smatch m;
    if (!std::regex_search(line, m, std::regex("^ +[0-9]+ +127\\.0\\.0\\.1 .* +6 +1 +([0-9]+)"))) {
      continue;
    }
    ++rows;
    CHECK(std::stoi(m[1]) >= 2);
  }
  CHECK(rows == kWorld);

  Touch(out + "/done");
  CHECK(h.Wait(p, 60) == 0);
}
