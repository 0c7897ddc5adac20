// --ckpt_dir and --ckpt_every (docs/checkpoint.md, "Persistence"), with real
// PyTorch under ddprun: the agent persists each rank's newest committed
// snapshot; a fresh job on that directory resumes bit-identically; the file
// parses as safetensors with plain struct/json; SIGTERM persists the newest
// step within the grace period; a corrupt or foreign file is refused by
// name; a full disk keeps the memory snapshot and says so in one line.
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "e2e/checkpoint_support.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using ddprun::test::EnvList;
using ddprun::test::Harness;
using ddprun::test::ListDir;
using ddprun::test::Proc;
using ddprun::test::ReadFile;
using ddprun::test::SkipCase;
using ddprun::test::SleepMs;
using ddprun::test::checkpoint::kPython;
using ddprun::test::checkpoint::kTrainScript;
using ddprun::test::checkpoint::ReadLog;
using ddprun::test::checkpoint::TorchAvailable;
using ddprun::test::checkpoint::WorkerEnv;

struct Run {
  int rc;
  std::string out;  // the workers' log directory
  std::string err;  // ddprun's stderr
};

// The training script for `steps` steps on 2 ranks, no failure, with flags.
Run Train(Harness& h, const std::string& name, int steps, const std::vector<std::string>& flags) {
  const std::string out = h.MakeDir(name);
  const std::string script = h.Script("train.py", kTrainScript);
  std::vector<std::string> args{"--nproc_per_node=2"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {script, out, std::to_string(steps), "-1"});
  Proc& p = h.StartDdprun(name, args, WorkerEnv());
  const int rc = h.Wait(p, 240);
  return {rc, out, p.Err()};
}

std::string Log(const Run& r, int rank) {
  return r.out + "/rank" + std::to_string(rank) + ".attempt0.txt";
}

// The step folders of a --ckpt_dir, sorted.
std::vector<std::string> Steps(const std::string& dir) {
  std::vector<std::string> steps;
  for (const std::string& n : ListDir(dir)) {
    if (n.rfind("step-", 0) == 0) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Runs python3 on a script with args; returns its exit code, output in *out.
int Python(Harness& h, const std::string& name, const std::string& text,
           const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv{kPython, h.Script(name, text)};
  argv.insert(argv.end(), args.begin(), args.end());
  Proc& p = h.Start(name, argv, WorkerEnv());
  const int rc = h.Wait(p, 120);
  *out = p.Out() + p.Err();
  return rc;
}

// Reads a rank's file of a --ckpt_dir with struct and json alone (no
// ddprun, no safetensors package), checks safetensors' rules (the header,
// each tensor's size from dtype and shape, the data covered without holes),
// and prints the training script's digest of the parameters and momentum
// buffers from the raw bytes; then the same through ddprun.checkpoint.load_dir.
constexpr const char* kVerifyScript = R"(import hashlib, json, math, os, struct, sys, zlib
folder, rank = sys.argv[1], int(sys.argv[2])
manifest = {}
for f in os.listdir(folder):
    if f.startswith("manifest-"):
        manifest.update(json.load(open(os.path.join(folder, f)))["ranks"])
data = open(os.path.join(folder, "rank-%05d.safetensors" % rank), "rb").read()
entry = manifest[str(rank)]
assert len(data) == entry["size"] and zlib.crc32(data) == entry["crc32"], entry
(n,) = struct.unpack("<Q", data[:8])
assert n % 8 == 0 and data[8:9] == b"{", n
header = json.loads(data[8:8 + n])
body = data[8 + n:]
sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}
meta = header.pop("__metadata__")
assert all(isinstance(v, str) for v in meta.values()), meta
spans = sorted((t["data_offsets"][0], t["data_offsets"][1], name) for name, t in header.items())
at = 0
for b, e, name in spans:
    t = header[name]
    assert b == at, (name, b, at)
    assert e - b == sizes[t["dtype"]] * math.prod(t["shape"]), name
    at = e
assert at == len(body), (at, len(body))
raw = {name: body[t["data_offsets"][0]:t["data_offsets"][1]] for name, t in header.items()}
tree = json.loads(meta["ddprun.tree"])["state"]
top = {k: v for k, v in tree["items"]}
h = hashlib.sha256()
for k, v in top["model"]["items"]:
    h.update(k.encode()); h.update(raw[v["tensor"]])
opt_state = {k: v for k, v in top["opt"]["items"]}["state"]
for k, v in sorted(opt_state["items"], key=lambda kv: kv[0]):
    buf = {kk: vv for kk, vv in v["items"]}["momentum_buffer"]
    h.update(raw[buf["tensor"]])
print("raw", meta["ddprun.step"], h.hexdigest(), flush=True)

import ddprun.checkpoint as ckpt
step, state = ckpt.load_dir(os.path.dirname(folder), rank=rank, map_location="cpu")
h = hashlib.sha256()
for k, v in state["model"].items():
    h.update(k.encode()); h.update(v.numpy().tobytes())
for _, s in sorted(state["opt"]["state"].items()):
    h.update(s["momentum_buffer"].numpy().tobytes())
assert state["step"] == step
print("load_dir", step, h.hexdigest(), flush=True)
)";

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("ckpt_dir: a fresh job resumes from the persisted step, bit-identical; safetensors",
          "[e2e][checkpoint][ckpt_dir]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const Run clean = Train(h, "clean", 8, {});
  INFO("clean:\n" << clean.err);
  REQUIRE(clean.rc == 0);
  const std::string final_digest = ReadLog(Log(clean, 0))["final"];
  REQUIRE(final_digest.size() == 64);

  const std::string dir = h.dir() + "/ckpt";
  const Run first = Train(h, "first", 5, {"--ckpt_dir=" + dir});
  INFO("first:\n" << first.err);
  REQUIRE(first.rc == 0);
  CHECK(Has(first.err, "--ckpt_dir: step 4 is persisted in " + dir + " (the job's end)"));
  // Only the newest complete step stays.
  REQUIRE(Steps(dir) == std::vector<std::string>{"step-4"});
  std::vector<std::string> files = ListDir(dir + "/step-4");
  std::sort(files.begin(), files.end());
  CHECK(files == (std::vector<std::string>{"manifest-0-1.json", "rank-00000.safetensors",
                                           "rank-00001.safetensors"}));

  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const std::string saved = ReadLog(Log(first, rank))["saved 4"];
    std::string out;
    REQUIRE(Python(h, "verify" + std::to_string(rank) + ".py", kVerifyScript,
                   {dir + "/step-4", std::to_string(rank)}, &out) == 0);
    INFO(out);
    CHECK(Has(out, "raw 4 " + saved));
    CHECK(Has(out, "load_dir 4 " + saved));
  }

  const Run second = Train(h, "second", 8, {"--ckpt_dir=" + dir});
  INFO("second:\n" << second.err);
  REQUIRE(second.rc == 0);
  CHECK(Has(second.err, "--ckpt_dir: resuming from step 4 in " + dir));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ":\n" << ReadFile(Log(second, rank)));
    auto before = ReadLog(Log(first, rank));
    auto after = ReadLog(Log(second, rank));
    REQUIRE(after.count("resumed 4") == 1);
    CHECK(after["resumed 4"] == before["saved 4"]);
    CHECK(after.count("saved 4") == 0);
    CHECK(after.count("saved 5") == 1);
    CHECK(after["final"] == final_digest);
  }
  CHECK(Steps(dir) == std::vector<std::string>{"step-7"});
}

TEST_CASE("ckpt_dir: SIGTERM persists the newest committed step within the grace period",
          "[e2e][checkpoint][ckpt_dir]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string dir = h.dir() + "/ckpt";
  const std::string out = h.MakeDir("out");
  // In step as DDP keeps ranks: a barrier per step.
  const std::string script = h.Script("steps.py", R"(import os, sys, time
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
log = open(os.path.join(sys.argv[1], "rank%d.txt" % rank), "w", buffering=1)
for step in range(100000):
    dist.barrier()
    ckpt.save({"w": torch.full((4096,), float(step)), "step": step}, step)
    log.write("saved %d\n" % step)
    time.sleep(0.02)
)");
  // --ckpt_bandwidth 1 (a byte a second): the background writes stall
  // after their first chunk, and the flush on SIGTERM is never paced, even
  // the write it catches waiting.
  Proc& p = h.StartDdprun(
      "sigterm", {"--nproc_per_node=2", "--ckpt_dir=" + dir, "--ckpt_bandwidth=1", script, out},
      WorkerEnv());
  // Until both ranks saved a few steps (a deadline loop).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  auto lines = [&](int rank) {
    return ddprun::test::Lines(ReadFile(out + "/rank" + std::to_string(rank) + ".txt"));
  };
  while ((lines(0).size() < 5 || lines(1).size() < 5) &&
         std::chrono::steady_clock::now() < deadline) {
    SleepMs(20);
  }
  REQUIRE(lines(0).size() >= 5);
  REQUIRE(lines(1).size() >= 5);
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  h.Wait(p, 60);
  INFO(p.Err());
  // Each rank committed its last logged step, maybe one more.
  int newest_logged = 1 << 30;
  for (int rank = 0; rank < 2; ++rank) {
    const auto l = lines(rank);
    newest_logged = std::min(newest_logged, std::stoi(l.back().substr(6)));
  }
  const auto steps = Steps(dir);
  REQUIRE(steps.size() == 1);
  const int persisted = std::stoi(steps[0].substr(5));
  CHECK(persisted >= newest_logged);
  CHECK(persisted <= newest_logged + 1);
  CHECK(Has(p.Err(), "--ckpt_dir: step " + std::to_string(persisted) + " is persisted in " + dir +
                         " (SIGTERM, within the grace period)"));
  std::string check;
  REQUIRE(Python(h, "check.py", R"(import sys
import ddprun.checkpoint as ckpt
for rank in (0, 1):
    step, state = ckpt.load_dir(sys.argv[1], rank=rank)
    assert state["step"] == step and float(state["w"][0]) == step, (step, state["step"])
    print("rank", rank, "step", step, flush=True)
)",
                 {dir}, &check) == 0);
  INFO(check);
  CHECK(Has(check, "rank 1 step " + std::to_string(persisted)));
}

TEST_CASE("ckpt_dir: a corrupt or foreign file is refused by name; older step, then fresh",
          "[e2e][checkpoint][ckpt_dir]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  namespace fs = std::filesystem;
  const std::string dir = h.dir() + "/ckpt";
  const Run a = Train(h, "a", 2, {"--ckpt_dir=" + dir});
  INFO("a:\n" << a.err);
  REQUIRE(a.rc == 0);
  REQUIRE(Steps(dir) == std::vector<std::string>{"step-1"});
  fs::copy(dir + "/step-1", h.dir() + "/kept-step-1");
  const Run b = Train(h, "b", 3, {"--ckpt_dir=" + dir});
  INFO("b:\n" << b.err);
  REQUIRE(b.rc == 0);
  REQUIRE(Steps(dir) == std::vector<std::string>{"step-2"});  // step 1 removed
  fs::copy(h.dir() + "/kept-step-1", dir + "/step-1");

  // One byte of rank 1's step-2 file flipped; a stray file in the folder.
  const std::string corrupt = dir + "/step-2/rank-00001.safetensors";
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-10, std::ios::end);
    f.put(static_cast<char>(c ^ 0x55));
  }
  std::ofstream(dir + "/notes.txt") << "mine\n";
  const Run c = Train(h, "c", 4, {"--ckpt_dir=" + dir});
  INFO("c:\n" << c.err);
  REQUIRE(c.rc == 0);
  CHECK(Has(c.err, "--ckpt_dir: refusing " + corrupt + ": its CRC-32 is "));
  CHECK(Has(c.err, "(a corrupt file)"));
  CHECK(Has(c.err, "--ckpt_dir: ignoring " + dir + "/notes.txt: not a step folder of ddprun"));
  CHECK(Has(c.err, "--ckpt_dir: resuming from step 1 in " + dir + " (an older complete step)"));
  for (int rank = 0; rank < 2; ++rank) {
    auto log = ReadLog(Log(c, rank));
    REQUIRE(log.count("resumed 1") == 1);
    CHECK(log["resumed 1"] == ReadLog(Log(a, rank))["saved 1"]);
  }
  REQUIRE(Steps(dir) == std::vector<std::string>{"step-3"});
  CHECK(fs::exists(dir + "/notes.txt"));  // not ddprun's: left alone

  // A foreign file under a ddprun name, its manifest entry matching it:
  // a safetensors file without ddprun's metadata.
  std::string out;
  REQUIRE(Python(h, "foreign.py", R"(import json, struct, sys, zlib
folder = sys.argv[1]
header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
header += b" " * (-len(header) % 8)
data = struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1, 2)
open(folder + "/rank-00000.safetensors", "wb").write(data)
m = json.load(open(folder + "/manifest-0-1.json"))
m["ranks"]["0"].update(size=len(data), crc32=zlib.crc32(data))
json.dump(m, open(folder + "/manifest-0-1.json", "w"))
)",
                 {dir + "/step-3"}, &out) == 0);
  const Run d = Train(h, "d", 2, {"--ckpt_dir=" + dir});
  INFO("d:\n" << d.err);
  REQUIRE(d.rc == 0);
  CHECK(Has(d.err, "--ckpt_dir: refusing " + dir +
                       "/step-3/rank-00000.safetensors: not a ddprun checkpoint: no "
                       "\"ddprun.format\": \"1\" in its __metadata__"));
  CHECK(Has(d.err,
            "--ckpt_dir: no complete step in " + dir + " that this job can load; starting fresh"));
  CHECK(ReadLog(Log(d, 0)).count("resumed 3") == 0);
  CHECK(ReadLog(Log(d, 0)).count("saved 0") == 1);
}

TEST_CASE("ckpt_dir: a full disk keeps the memory snapshot and says so in one line",
          "[e2e][checkpoint][ckpt_dir]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string dir = h.MakeDir("small");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m,mode=0700") != 0) {
    return SkipCase("e2e", std::string("cannot mount a 1 MiB tmpfs (") + std::strerror(errno) +
                               "); the full-disk case needs root");
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  const std::string out = h.MakeDir("out");
  // 2 MiB per rank and step: no file fits. Rank 1 dies at step 3 once.
  const std::string script = h.Script("full.py", R"(import os, signal, sys
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
log = open(os.path.join(sys.argv[1], "rank%d.attempt%s.txt" % (rank, attempt)), "w", buffering=1)
start = 0
resumed = ckpt.load()
if resumed is not None:
    step, state = resumed
    assert state["step"] == step and float(state["w"][-1]) == step
    log.write("resumed %d\n" % step)
    start = step + 1
for step in range(start, 6):
    dist.barrier()  # in step, as DDP keeps ranks
    if step == 3 and rank == 1 and attempt == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    ckpt.save({"w": torch.full((512 * 1024,), float(step)), "step": step}, step)
    log.write("saved %d\n" % step)
)");
  Proc& p = h.StartDdprun(
      "full", {"--nproc_per_node=2", "--max_restarts=1", "--ckpt_dir=" + dir, script, out},
      WorkerEnv());
  const int rc = h.Wait(p, 240);
  const std::string err = p.Err();
  INFO(err);
  REQUIRE(rc == 0);
  // The restarted workers resumed from memory.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = ReadFile(out + "/rank" + std::to_string(rank) + ".attempt1.txt");
    INFO("rank " << rank << ": " << log);
    CHECK(Has(log, "resumed 2\n"));
  }
  CHECK(Has(err,
            "checkpoint: the workers resume from step 2 (the newest step every worker "
            "committed)"));
  std::size_t lines = 0;
  for (const std::string& l : ddprun::test::Lines(err)) {
    if (Has(l, "--ckpt_dir: cannot persist step")) {
      ++lines;
      CHECK(Has(l, "No space left on device; the snapshot stays in memory and the job goes on"));
    }
  }
  CHECK(lines == 1);
  // Nothing partial is left: no step folder holds a rank file.
  for (const std::string& s : Steps(dir)) CHECK(ListDir(dir + "/" + s).empty());
}

TEST_CASE("ckpt_dir: the failure report names the step a job started again resumes from",
          "[e2e][checkpoint][ckpt_dir]") {
  Harness h;
  const std::string dir = h.dir() + "/ckpt";
  const std::string out = h.MakeDir("out");
  // Both ranks save steps 0-2; then rank 1 fails (no restarts left).
  const std::string script = h.Script("fail.py", R"(import os, sys, time
import ddprun.checkpoint as ckpt
rank, out = int(os.environ["RANK"]), sys.argv[1]
for step in range(3):
    ckpt.save({"step": step}, step)
open(os.path.join(out, "done%d" % rank), "w").close()
deadline = time.monotonic() + 60
while not all(os.path.exists(os.path.join(out, "done%d" % r)) for r in (0, 1)):
    assert time.monotonic() < deadline
    time.sleep(0.01)
sys.exit(1 if rank == 1 else 0)
)");
  Proc& p =
      h.StartDdprun("fail", {"--nproc_per_node=2", "--ckpt_dir=" + dir, script, out}, WorkerEnv());
  const int rc = h.Wait(p, 120);
  const std::string err = p.Err();
  INFO(err);
  CHECK(rc == 1);
  CHECK(Has(err, "ddprun:   checkpoint: a job started again with --ckpt_dir " + dir +
                     " resumes from step 2 (this node's newest committed step, persisted at the "
                     "job's end)"));
  CHECK(Steps(dir) == std::vector<std::string>{"step-2"});

  // Without --ckpt_dir: the step ends with the job, and the report says so.
  Proc& q =
      h.StartDdprun("fail_mem", {"--nproc_per_node=2", script, h.MakeDir("out2")}, WorkerEnv());
  CHECK(h.Wait(q, 120) == 1);
  INFO(q.Err());
  CHECK(Has(q.Err(),
            "ddprun:   checkpoint: step 2 was committed in memory and ends with this job; "
            "--ckpt_dir DIR keeps it for a job started again"));
}

TEST_CASE("ckpt_every: save keeps multiples of N; a restart resumes from the newest",
          "[e2e][checkpoint]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  // Rank 1 dies at step 5 once rank 0 has saved step 4 (a deadline loop on
  // rank 0's log, as DDP's steps keep ranks together). Rank 0's log may not
  // exist yet when rank 1 gets there (the ranks start independently): the
  // loop waits for the file as for the line, under the same deadline.
  const std::string script = h.Script("every.py", R"(import os, signal, sys, time
import ddprun.checkpoint as ckpt
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
out = sys.argv[1]
log = open(os.path.join(out, "rank%d.attempt%s.txt" % (rank, attempt)), "w", buffering=1)
start = 0
resumed = ckpt.load()
if resumed is not None:
    log.write("resumed %d %d\n" % (resumed[0], resumed[1]["step"]))
    start = resumed[0] + 1
for step in range(start, 8):
    if step == 5 and rank == 1 and attempt == "0":
        deadline = time.monotonic() + 60
        rank0 = os.path.join(out, "rank0.attempt0.txt")
        while not (os.path.exists(rank0) and "save 4" in open(rank0).read()):
            assert time.monotonic() < deadline, "rank 0 did not save step 4"
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    log.write("save %d %s\n" % (step, ckpt.save({"step": step}, step)))
)");
  Proc& p = h.StartDdprun("every",
                          {"--nproc_per_node=2", "--max_restarts=1", "--ckpt_every=3", script, out},
                          WorkerEnv());
  const int rc = h.Wait(p, 120);
  INFO(p.Err());
  REQUIRE(rc == 0);
  const std::string first = ReadFile(out + "/rank1.attempt0.txt");
  INFO(first);
  CHECK(Has(first, "save 0 True\nsave 1 False\nsave 2 False\nsave 3 True\nsave 4 False\n"));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string second = ReadFile(out + "/rank" + std::to_string(rank) + ".attempt1.txt");
    INFO("rank " << rank << ": " << second);
    CHECK(second.rfind("resumed 3 3\nsave 4 False\nsave 5 False\nsave 6 True\n", 0) == 0);
  }
}

TEST_CASE("ckpt_dir: a directory that cannot be made, or no checkpoint memory, is one line",
          "[e2e][checkpoint][ckpt_dir]") {
  Harness h;
  const std::string script = h.Script("noop.py", "pass\n");
  const std::string file = h.Script("a_file", "not a folder\n");
  Proc& p =
      h.StartDdprun("file", {"--nproc_per_node=1", "--ckpt_dir=" + file, script}, WorkerEnv());
  CHECK(h.Wait(p, 60) == 2);
  INFO(p.Err());
  CHECK(Has(p.Err(), "--ckpt_dir: cannot create " + file +
                         ": Not a directory; give a directory ddprun can write (or leave "
                         "--ckpt_dir out)"));
  Proc& q = h.StartDdprun(
      "nomem", {"--nproc_per_node=1", "--ckpt_dir=" + h.dir() + "/d", "--ckpt_shm_limit=0", script},
      WorkerEnv());
  CHECK(h.Wait(q, 60) == 2);
  INFO(q.Err());
  CHECK(Has(q.Err(), "--ckpt_dir needs checkpoint memory; drop --ckpt_shm_limit 0"));
}
