// What the checkpoint tests of the e2e tier share (checkpoint_test.cc,
// checkpoint_persist_test.cc, checkpoint_replica_test.cc): Debian's python3
// with torch, the workers' environment, the flags of one node of a job on
// loopback, the DDP training script and its per-attempt logs.
#pragma once

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/process_helpers.h"

namespace ddprun::test::checkpoint {

inline const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here
inline const std::string kPythonDir =
    std::string(DDPRUN_BIN_DIR) + "/../python";  // build/python/ddprun

inline bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

inline EnvList WorkerEnv() { return {{"PYTHON_EXEC", kPython}, {"PYTHONPATH", kPythonDir}}; }

// The flags that make one ddprun a node of job `id`, `nnodes` nodes of one
// worker each: it joins the test's ddprund at 127.0.0.1:<port> from
// 127.0.0.<idx> (every loopback address is this host's, so each node has an
// address of its own).
inline std::vector<std::string> NodeFlags(int port, const std::string& id, int nnodes, int idx) {
  return {"--nnodes=" + std::to_string(nnodes), "--nproc_per_node=1",
          "--local_addr=127.0.0." + std::to_string(idx),
          "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=" + id};
}

// Trains a small model with DDP for argv[2] steps, saving after every step;
// rank 1 kills itself at the start of step argv[3] on the first attempt.
// Each rank logs "resumed <step> <digest>", "saved <step> <digest>" and
// "final <digest>" (sha256 of parameters and momentum buffers) per attempt.
inline constexpr const char* kTrainScript = R"(import faulthandler, hashlib, os, signal, sys
faulthandler.dump_traceback_later(120, exit=True)
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt

out, steps, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

def digest():
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode()); h.update(v.numpy().tobytes())
    for _, s in sorted(opt.state_dict()["state"].items()):
        h.update(s["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()

log = open(os.path.join(out, "rank%d.attempt%s.txt" % (rank, attempt)), "w", buffering=1)
start = 0
resumed = ckpt.load()
if resumed is not None:
    step, state = resumed
    assert state["step"] == step and type(state["step"]) is int, state["step"]
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = step + 1
    log.write("resumed %d %s\n" % (step, digest()))
for step in range(start, steps):
    if step == kill_at and rank == 1 and attempt == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    ckpt.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step)
    log.write("saved %d %s\n" % (step, digest()))
log.write("final %s\n" % digest())
dist.destroy_process_group()
)";

// "<word> <a> [<b>]" lines of one rank's attempt, keyed by word + a.
inline std::map<std::string, std::string> ReadLog(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(ReadFile(path));
  std::string word, a, b;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> word >> a;
    if (ls >> b) {
      out[word + " " + a] = b;
    } else {
      out[word] = a;
    }
  }
  return out;
}

}  // namespace ddprun::test::checkpoint
