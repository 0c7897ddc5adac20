// The snapshot checksum of checkpoint memory (docs/checkpoint.md, "Format"),
// with real PyTorch under ddprun: a rank whose Python has no SDK library
// writes zlib's CRC-32 (kind 0) while the other writes CRC-32C (kind 1);
// after rank 1's kill -9 both load the same step, and the agent, which
// checks either kind, persists it to --ckpt_dir. A snapshot changed in
// memory after its commit is refused by load, naming the step and both
// checksums.
#include <catch2/catch.hpp>
#include <string>

#include "e2e/checkpoint_support.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using namespace ddprun::test;
using checkpoint::kPython;
using checkpoint::kPythonDir;
using checkpoint::TorchAvailable;
using checkpoint::WorkerEnv;

// argv: out dir, mode. Attempt 0 saves steps 0..3 of a 4 MiB tensor per
// rank (rank 1 without the SDK library: zlib's CRC-32), then rank 1 kills
// itself once rank 0 has saved step 3 too. Attempt 1 writes "<kinds of its
// committed records> <step> ok" or the load's error to out/rank<R>.txt.
// mode "corrupt": after the last save, rank 1 changes one byte of its
// newest snapshot first.
constexpr const char* kScript = R"(import os, signal, sys, time
import torch
import ddprun.checkpoint as ckpt

out, mode = sys.argv[1], sys.argv[2]
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt == "0":
    if rank == 1:
        ckpt._copier = None  # as without libddprun_worker_sdk.so
    for step in range(4):
        ckpt.save({"w": torch.full((1 << 20,), float(10 * rank + step)), "step": step}, step)
    open(os.path.join(out, "saved%d" % rank), "w").close()
    if rank == 1:
        deadline = time.monotonic() + 60  # rank 0 has committed step 3 too
        while not os.path.exists(os.path.join(out, "saved0")) and time.monotonic() < deadline:
            time.sleep(0.01)
        if mode == "corrupt":
            mem = ckpt._mem()
            slot = max((s for s in (0, 1) if mem.record(s)[0] == 2), key=lambda s: mem.record(s)[2])
            at = mem.data_offset(slot) + mem.record(slot)[4] - 100
            mem.mm[at] = (mem.mm[at] + 1) % 256
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # stopped by the agent
mem = ckpt._mem()
kinds = ",".join(str(mem.record(s)[7]) for s in (0, 1) if mem.record(s)[0] == 2)
try:
    step, state = ckpt.load()
    want = torch.full((1 << 20,), float(10 * rank + step))
    assert state["step"] == step and torch.equal(state["w"], want)
    text = "%s %d ok" % (kinds, step)
except ckpt.Error as e:
    text = str(e)
open(os.path.join(out, "rank%d.txt" % rank), "w").write(text + "\n")
)";

}  // namespace

TEST_CASE(
    "checkpoint: a rank saving with zlib's CRC-32 and one with CRC-32C both resume after kill -9, "
    "and the agent persists both",
    "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string dir = h.dir() + "/ckpt";
  const std::string script = h.Script("kinds.py", kScript);
  Proc& p = h.StartDdprun("ddprun",
                          {"--nproc_per_node=2", "--max_restarts=1", "--ckpt_shm_limit=16MiB",
                           "--ckpt_dir", dir, kPython, script, out, "kinds"},
                          WorkerEnv());
  const int rc = h.Wait(p, 240);
  INFO(p.Out() << p.Err());
  REQUIRE(rc == 0);
  // Both slots of each rank hold steps 2 and 3, of the rank's kind.
  CHECK(ReadFile(out + "/rank0.txt") == "1,1 3 ok\n");
  CHECK(ReadFile(out + "/rank1.txt") == "0,0 3 ok\n");
  // The agent read both kinds back (checking each) and wrote step 3.
  Proc& check = h.Start(
      "load_dir",
      {kPython, "-c",
       "import sys, torch; sys.path.insert(0, '" + kPythonDir +
           "'); import ddprun.checkpoint as c\n"
           "for r in (0, 1):\n"
           "    step, s = c.load_dir('" +
           dir +
           "', rank=r)\n"
           "    assert step == 3 and torch.equal(s['w'], torch.full((1 << 20,), 10.0 * r + 3)), r\n"
           "print('persisted ok')"});
  REQUIRE(h.Wait(check, 60) == 0);
  CHECK(check.Out() == "persisted ok\n");
}

TEST_CASE("checkpoint: a snapshot changed in memory after its commit is refused by load by step",
          "[e2e][checkpoint]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string script = h.Script("kinds.py", kScript);
  Proc& p = h.StartDdprun("ddprun",
                          {"--nproc_per_node=2", "--max_restarts=1", "--ckpt_shm_limit=16MiB",
                           kPython, script, out, "corrupt"},
                          WorkerEnv());
  const int rc = h.Wait(p, 240);
  INFO(p.Out() << p.Err());
  REQUIRE(rc == 0);
  CHECK(ReadFile(out + "/rank0.txt") == "1,1 3 ok\n");
  const std::string error = ReadFile(out + "/rank1.txt");
  INFO(error);
  CHECK(error.find(
            "ddprun.checkpoint.load: the snapshot of step 3 in memory is corrupt (checksum ") == 0);
  CHECK(error.find("recorded ") != std::string::npos);
}
