// Checkpoints in memory owned by the agent (docs/checkpoint.md), with real
// PyTorch (python3-torch, CPU, gloo) under ddprun: a DDP job whose rank 1 is
// killed resumes on every rank from the newest step all ranks committed,
// with bit-identical parameters, and ends where a run without the failure
// ends; a rank killed in the middle of save still loads its previous
// snapshot; the state round-trips its types; bad input is named; and the
// memory is gone with the job, also after kill -9 of ddprun.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "e2e/checkpoint_support.h"
#include "support/job_processes.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using ddprun::test::DescriptorHoldersNaming;
using ddprun::test::DevShmOf;
using ddprun::test::EnvList;
using ddprun::test::Harness;
using ddprun::test::Proc;
using ddprun::test::ReadFile;
using ddprun::test::SkipCase;
using ddprun::test::checkpoint::kPython;
using ddprun::test::checkpoint::kTrainScript;
using ddprun::test::checkpoint::NodeFlags;
using ddprun::test::checkpoint::ReadLog;
using ddprun::test::checkpoint::TorchAvailable;
using ddprun::test::checkpoint::WorkerEnv;

// The holders of checkpoint memory among the test's own processes
// (support/job_processes.h): pid -> the memory files it holds, distinct
// ("/memfd:ddprun-ckpt-<local rank> (deleted)"; Python's mmap holds a duplicate).
std::map<pid_t, std::set<std::string>> CheckpointMemoryHolders(const Harness& h) {
  return DescriptorHoldersNaming(h.dir(), "memfd:ddprun-ckpt-");
}

// Runs the training script under ddprun; returns its output directory, and
// the launcher's pid in *launcher when given.
std::string Train(Harness& h, const std::string& name, int kill_at, const EnvList& extra = {},
                  pid_t* launcher = nullptr) {
  const std::string out = h.MakeDir(name);
  const std::string script = h.Script("train.py", kTrainScript);
  EnvList env = WorkerEnv();
  env.insert(env.end(), extra.begin(), extra.end());
  Proc& p = h.StartDdprun(
      name, {"--nproc_per_node=2", "--max_restarts=1", script, out, "8", std::to_string(kill_at)},
      env);
  const int rc = h.Wait(p, 240);
  INFO(name << " stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  if (launcher != nullptr) *launcher = p.pid;
  return out;
}

// Both ranks resumed from `step` with the parameters they had saved there
// on the first attempt, and ended with `final_digest`.
void CheckResumed(const std::string& out, int step, const std::string& final_digest) {
  std::set<std::string> resumed;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = out + "/rank" + std::to_string(rank);
    auto first = ReadLog(prefix + ".attempt0.txt");
    auto second = ReadLog(prefix + ".attempt1.txt");
    INFO("rank " << rank << " attempt 1:\n" << ReadFile(prefix + ".attempt1.txt"));
    const std::string key = "resumed " + std::to_string(step);
    REQUIRE(second.count(key) == 1);
    REQUIRE(first.count("saved " + std::to_string(step)) == 1);
    CHECK(second[key] == first["saved " + std::to_string(step)]);
    // It trained from step + 1, not from scratch nor from a later step.
    CHECK(second.count("saved " + std::to_string(step)) == 0);
    CHECK(second.count("saved " + std::to_string(step + 1)) == 1);
    CHECK(second["final"] == final_digest);
    resumed.insert(second[key]);
  }
  CHECK(resumed.size() == 1);
}

std::string CleanFinal(Harness& h, pid_t* launcher = nullptr) {
  const std::string clean = Train(h, "clean", -1, {}, launcher);
  auto r0 = ReadLog(clean + "/rank0.attempt0.txt");
  auto r1 = ReadLog(clean + "/rank1.attempt0.txt");
  REQUIRE(r0["final"].size() == 64);
  REQUIRE(r0["final"] == r1["final"]);
  return r0["final"];
}

}  // namespace

TEST_CASE("checkpoint: rank 1 killed at step 5 resumes at step 5 on every rank, bit-identical",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  pid_t clean = -1, killed = -1;
  const std::string final_digest = CleanFinal(h, &clean);
  const std::string out = Train(h, "killed", /*kill_at=*/5, {}, &killed);
  CheckResumed(out, 4, final_digest);  // the newest step both committed: 4
  // Nothing of either job is left: no directory of its agent in /dev/shm,
  // no process of this test holding checkpoint memory.
  CHECK(DevShmOf({clean, killed}).empty());
  CHECK(CheckpointMemoryHolders(h).empty());
}

TEST_CASE("checkpoint: a rank killed in the middle of save loads its previous snapshot",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string final_digest = CleanFinal(h);
  // Rank 1 dies halfway through copying step 5 over the slot of step 3; rank
  // 0 may have committed step 5. The step every rank has is 4.
  const std::string out = Train(h, "torn", -1, {{"DDPRUN_CKPT_TEST_DIE_IN_SAVE", "1:5"}});
  auto first = ReadLog(out + "/rank1.attempt0.txt");
  CHECK(first.count("saved 4") == 1);
  CHECK(first.count("saved 5") == 0);
  CheckResumed(out, 4, final_digest);
}

TEST_CASE("checkpoint: types round-trip through a restart; bad input is named",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string script = h.Script("types.py", R"(import collections, math, os, sys
import numpy as np, torch
import ddprun.checkpoint as ckpt

def make():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "f32": base, "noncontig": base.t(), "bf16": base.to(torch.bfloat16),
        "i64": torch.tensor(7, dtype=torch.int64), "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3), "param": torch.nn.Parameter(torch.ones(2)),
        "np16": np.arange(5, dtype=np.float16), "npscalar": np.int32(-3),
        "np0d": np.array(2.5), "npT": np.arange(6).reshape(2, 3).T,
        "od": collections.OrderedDict([(2, "b"), (1, "a")]),
        "nested": [1, 2.5, (True, None, "s"), {0: b"\x00\x01", "x": bytearray(b"z")}],
        "nan": float("nan"), "big": 1 << 70,
    }

attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt == "0":
    assert ckpt.load() is None
    try:
        ckpt.save({"a": {"b": [1, object()]}}, 0)
    except ckpt.UnsupportedError as e:
        print("UNSUPPORTED:", e, flush=True)
    try:
        ckpt.save({"big": torch.zeros(1 << 20)}, 0)  # 4 MiB > the 1 MiB limit
    except ckpt.Error as e:
        print("LIMIT:", e, flush=True)
    ckpt.save(make(), 41)
    ckpt.save(make(), 42)
    sys.exit(3)  # a failure: the agent restarts the worker
step, got = ckpt.load()
want = make()
assert step == 42, step
for k in ("f32", "noncontig", "bf16", "i64", "bool", "empty"):
    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
    assert torch.equal(got[k], want[k]), k
    assert got[k].device == want[k].device, k
assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
assert got["np16"].dtype == np.float16 and (got["np16"] == want["np16"]).all()
assert type(got["npscalar"]) is np.int32 and got["npscalar"] == -3
assert got["np0d"].shape == () and got["np0d"] == 2.5
assert got["npT"].shape == (3, 2) and (got["npT"] == want["npT"]).all()
assert type(got["od"]) is collections.OrderedDict and list(got["od"]) == [2, 1]
assert got["nested"] == want["nested"], got["nested"]
assert type(got["nested"][2]) is tuple and type(got["nested"][3]["x"]) is bytearray
assert math.isnan(got["nan"]) and got["big"] == 1 << 70
print("ROUNDTRIP OK", flush=True)
)");
  Proc& p = h.StartDdprun(
      "types", {"--nproc_per_node=1", "--max_restarts=1", "--ckpt_shm_limit=1MiB", script},
      WorkerEnv());
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("ROUNDTRIP OK") != std::string::npos);
  CHECK(out.find("UNSUPPORTED: ddprun.checkpoint.save: state['a']['b'][1] is an object") !=
        std::string::npos);
  CHECK(out.find("more than --ckpt_shm_limit (1.0 MiB, 1048576 bytes per worker); raise "
                 "--ckpt_shm_limit") != std::string::npos);
}

TEST_CASE("checkpoint: a loaded tensor is the caller's own memory, also after later saves",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  // Tensors of 1 MiB and more come back mapped copy-on-write from the
  // snapshot (docs/checkpoint.md, "How load returns tensors"): writing one
  // must not change the snapshot, and saving over the slot it came from
  // must not change a loaded tensor (or a view of one) still held.
  const std::string script = h.Script("own.py", R"(import os, sys
import torch
import ddprun.checkpoint as ckpt

def make(k):
    return {"w": torch.arange(1 << 21, dtype=torch.float32) * k,           # 8 MiB
            "b": torch.arange(3 << 20) % (k + 2) == 0,                        # 3 MiB of bool
            "p": torch.nn.Parameter(torch.full((1 << 20,), float(k), dtype=torch.bfloat16)),
            "small": torch.arange(10) * k}

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    ckpt.save(make(1), 0)
    sys.exit(3)  # a failure: the agent restarts the worker
want = make(1)
step, got = ckpt.load()
assert step == 0, step
for k, v in want.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
assert isinstance(got["p"], torch.nn.Parameter) and got["p"].requires_grad
got["w"] += 1                                 # every page of a loaded tensor written
with torch.no_grad():
    got["p"].fill_(7)
_, again = ckpt.load()                        # the snapshot itself is unchanged
assert torch.equal(again["w"], want["w"]) and torch.equal(again["p"], want["p"]), "snapshot changed"
view = again["w"][1000:1010]                  # only a view of an unwritten tensor is held
del again
ckpt.save(make(5), 1)
ckpt.save(make(9), 2)                         # over the slot step 0 was loaded from
assert torch.equal(view, want["w"][1000:1010]), view
assert torch.equal(got["b"], want["b"]), "a loaded tensor changed with a later save"
assert torch.equal(got["w"], want["w"] + 1) and bool((got["p"] == 7).all())
got["b"][:] = True                            # still writable, still its own
assert bool(got["b"].all())
print("OWN MEMORY OK", flush=True)
)");
  Proc& p = h.StartDdprun(
      "own", {"--nproc_per_node=1", "--max_restarts=1", "--ckpt_shm_limit=32MiB", script},
      WorkerEnv());
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out() + p.Err();
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("OWN MEMORY OK") != std::string::npos);
}

TEST_CASE("checkpoint: kill -9 of ddprun frees the memory; nothing in /dev/shm",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  const std::string script = h.Script("hold.py", R"(import os, sys, time
import ddprun.checkpoint as ckpt
ckpt.save({"x": list(range(1000))}, 1)
open(os.path.join(sys.argv[1], "%d.pid" % os.getpid()), "w").write(str(os.getpid()))
time.sleep(120)  # until ddprun is killed (PDEATHSIG)
)");
  Proc& p = h.StartDdprun("hold", {"--nproc_per_node=2", script, pids}, WorkerEnv());
  const std::vector<pid_t> workers = h.WaitForPids(pids, 2, 60);
  REQUIRE(workers.size() == 2);
  // The memory exists while the job runs: the agent holds every local
  // rank's, each worker its own only (the other rank's is close-on-exec).
  auto held = CheckpointMemoryHolders(h);
  REQUIRE(held.count(p.pid) == 1);
  CHECK(held[p.pid].size() == 2);
  std::set<std::string> of_workers;
  for (pid_t w : workers) {
    INFO("worker " << w);
    REQUIRE(held.count(w) == 1);
    CHECK(held[w].size() == 1);
    of_workers.insert(*held[w].begin());
  }
  CHECK(of_workers.size() == 2);
  ::kill(p.pid, SIGKILL);
  h.Wait(p, 10);
  h.RequireAllGone(workers, 10);
  CHECK(CheckpointMemoryHolders(h).empty());
  CHECK(DevShmOf({p.pid}).empty());
}

TEST_CASE("checkpoint: two nodes agree through the round's store; rank 1 killed at step 5",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string final_digest = CleanFinal(h);
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("two_nodes");
  const std::string script = h.Script("train.py", kTrainScript);
  auto node = [&](const std::string& name, int idx) -> Proc& {
    std::vector<std::string> args = NodeFlags(port, "ckpt-two-nodes", 2, idx);
    args.insert(args.end(), {"--max_restarts=1", script, out, "8", "5"});
    return h.StartDdprun(name, args, WorkerEnv());
  };
  Proc& a = node("a", 1);
  Proc& b = node("b", 2);
  const int ra = h.Wait(a, 240);
  const int rb = h.Wait(b, 240);
  INFO("node a:\n" << a.Err() << "\nnode b:\n" << b.Err());
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
  // One process per node: each node's agent knows only its own rank's
  // steps; the step both ranks hold is agreed in load().
  CheckResumed(out, 4, final_digest);
  h.StopDaemon(*daemon);
}
