// ddp::checkpoint and ddp_checkpoint_* (docs/checkpoint.md, "C++ and C")
// under the real ddprun: tests/sdk/worker/ckpt_worker.cc (C++) and
// ckpt_c_worker.c (C), trainers that save every step, resume after rank 1
// is killed (also in the middle of a save) on every rank from the newest
// step both committed with the bytes they saved, and end where a run
// without the failure ends; bad spans are named; and a C++ save loads
// in Python (ddprun.checkpoint) and a Python save loads in C++, through
// restarts of one job (the format is one).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// "<word> <a> [<b>]" lines of one rank's attempt, keyed by word + a.
std::map<std::string, std::string> ReadLog(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, a, b;
    ls >> word >> a;
    if (ls >> b) {
      out[word + " " + a] = b;
    } else {
      out[word] = a;
    }
  }
  return out;
}

// A trainer (ckpt_worker train, or ckpt_c_worker) under --nproc_per_node=2
// --max_restarts=1 for 8 steps, rank 1 killed in step `kill_at` after its all-reduce;
// returns the log dir (the trainers' "resumed/saved/final" lines per rank
// and attempt). `out_p`, if given, receives the job's stdout.
std::string Train(Harness& h, const std::string& name, const std::vector<std::string>& worker,
                  int kill_at, EnvList env = {}, std::string* out_p = nullptr) {
  const std::string out = h.MakeDir(name);
  std::vector<std::string> args = {"--nproc_per_node=2", "--max_restarts=1",
                                   "--ckpt_shm_limit=1MiB", "--no_python"};
  args.insert(args.end(), worker.begin(), worker.end());
  args.insert(args.end(), {out, "8", std::to_string(kill_at)});
  env.push_back({"DDP_BACKEND", "gloo"});
  env.push_back({"DDP_TIMEOUT_SEC", "30"});
  Proc& p = h.StartDdprun(name, args, env);
  const int rc = h.Wait(p, 120);
  INFO(name << " stdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  if (out_p) *out_p = p.Out();
  return out;
}

// The digest a run without a failure ends with, the same on both ranks.
std::string CleanFinal(Harness& h, const std::vector<std::string>& worker) {
  const std::string clean = Train(h, "clean", worker, -1);
  const std::string final_digest = ReadLog(clean + "/rank0.attempt0.txt")["final"];
  REQUIRE(final_digest.size() == 16);
  REQUIRE(ReadLog(clean + "/rank1.attempt0.txt")["final"] == final_digest);
  return final_digest;
}

// Both ranks resumed from `step` with the bytes they had saved there on the
// first attempt, trained on from step + 1, and ended with `final_digest`.
void CheckResumed(const std::string& out, int step, const std::string& final_digest) {
  const std::string s = std::to_string(step), next = std::to_string(step + 1);
  std::set<std::string> resumed;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = out + "/rank" + std::to_string(rank);
    auto first = ReadLog(prefix + ".attempt0.txt");
    auto second = ReadLog(prefix + ".attempt1.txt");
    INFO("rank " << rank << " attempt 0:\n"
                 << ReadFile(prefix + ".attempt0.txt") << "attempt 1:\n"
                 << ReadFile(prefix + ".attempt1.txt"));
    REQUIRE(second.count("resumed " + s) == 1);
    REQUIRE(first.count("saved " + s) == 1);
    CHECK(second["resumed " + s] == first["saved " + s]);
    CHECK(second.count("saved " + s) == 0);
    CHECK(second.count("saved " + next) == 1);
    CHECK(second["final"] == final_digest);
    resumed.insert(second["resumed " + s]);
  }
  CHECK(resumed.size() == 1);
}

}  // namespace

TEST_CASE("C++ checkpoint: rank 1 killed at step 5; both ranks resume from step 4, same bytes",
          "[sdk][checkpoint]") {
  Harness h;
  const std::vector<std::string> worker = {Bin("ckpt_worker"), "train"};
  const std::string final_digest = CleanFinal(h, worker);
  // Step 4 is the newest both committed: rank 1 died after step 5's
  // all-reduce (which rank 0 entered only once it had saved 4), before
  // saving 5; rank 0 may have saved 5 too, which rank 1 lacks.
  CheckResumed(Train(h, "killed", worker, 5), 4, final_digest);
}

TEST_CASE("C++ checkpoint: --ckpt_every 3 keeps steps 0, 3, 6; rank 1 killed at 5 resumes at 3",
          "[sdk][checkpoint]") {
  Harness h;
  const std::vector<std::string> worker = {Bin("ckpt_worker"), "train"};
  const std::string final_digest = CleanFinal(h, worker);
  // Save returns without saving steps 4 and 5: both ranks hold 0 and 3.
  CheckResumed(Train(h, "every", worker, 5, {{"PET_CKPT_EVERY", "3"}}), 3, final_digest);
}

TEST_CASE("C++ checkpoint: a rank killed in the middle of Save loads its previous snapshot",
          "[sdk][checkpoint]") {
  Harness h;
  const std::vector<std::string> worker = {Bin("ckpt_worker"), "train"};
  const std::string final_digest = CleanFinal(h, worker);
  // Rank 1 dies halfway through copying step 5 over the slot of step 3;
  // rank 0 may have committed step 5. The step both have is 4.
  const std::string out = Train(h, "torn", worker, -1, {{"DDPRUN_CKPT_TEST_DIE_IN_SAVE", "1:5"}});
  auto first = ReadLog(out + "/rank1.attempt0.txt");
  CHECK(first.count("saved 4") == 1);
  CHECK(first.count("saved 5") == 0);
  CheckResumed(out, 4, final_digest);
}

TEST_CASE("C checkpoint API: rank 1 killed at step 5 resumes from step 4; bad spans named",
          "[sdk][checkpoint][c-api]") {
  Harness h;
  const std::vector<std::string> worker = {Bin("ckpt_c_worker")};
  const std::string final_digest = CleanFinal(h, worker);
  std::string stdout_text;
  const std::string out = Train(h, "killed", worker, 5, {}, &stdout_text);
  CheckResumed(out, 4, final_digest);
  CHECK(Contains(ReadFile(out + "/rank0.attempt1.txt"), "missing refused"));
  INFO(stdout_text);
  CHECK(Contains(stdout_text, "ERROR limit: invalid argument: [job "));
  CHECK(Contains(stdout_text, "more than --ckpt_shm_limit (1.0 MiB, 1048576 bytes per worker)"));
  CHECK(Contains(stdout_text,
                 "ERROR null name: invalid argument: ddp_checkpoint_save: the name "
                 "of span 0 is a null pointer; give every span a name"));
  CHECK(Contains(stdout_text, "ERROR empty: invalid argument: [job "));
  CHECK(Contains(stdout_text, "span 0 has an empty name; give every span a name"));
  CHECK(Contains(stdout_text, "ERROR duplicate: invalid argument: [job "));
  CHECK(Contains(stdout_text, "the name 'a' is given twice (span 1)"));
}

TEST_CASE("C++ checkpoint: bad spans are one clear error each; nothing is written",
          "[sdk][checkpoint]") {
  Harness h;
  Proc& p = h.StartDdprun("bad",
                          {"--nproc_per_node=1", "--max_restarts=1", "--ckpt_shm_limit=1MiB",
                           "--no_python", Bin("ckpt_worker"), "bad"},
                          {});
  const int rc = h.Wait(p, 60);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  CHECK(Contains(out, "fresh start: yes"));
  CHECK(Contains(out, "ERROR limit (invalid argument): [job "));
  CHECK(Contains(out, "ddp::checkpoint::Save: the snapshot of step 1 needs 2.0 MiB ("));
  CHECK(Contains(out,
                 "more than --ckpt_shm_limit (1.0 MiB, 1048576 bytes per worker); raise "
                 "--ckpt_shm_limit (or PET_CKPT_SHM_LIMIT) or save less"));
  CHECK(Contains(out, "ERROR empty (invalid argument): "));
  CHECK(Contains(out, "ddp::checkpoint::Save: span 0 has an empty name; give every span a name"));
  CHECK(Contains(out, "ERROR duplicate (invalid argument): "));
  CHECK(Contains(out, "the name 'a' is given twice (span 1); give every span its own name"));
  CHECK(Contains(out, "ERROR null (invalid argument): "));
  CHECK_FALSE(Contains(out, "NO ERROR"));
  CHECK(Contains(out, "saved 2"));
}

TEST_CASE("C++ checkpoint outside ddprun: Save names DDPRUN_CKPT_FD", "[sdk][checkpoint]") {
  Harness h;
  Proc& p = h.Start("bare", {Bin("ckpt_worker"), "save"}, {{"DDPRUN_CKPT_FD", ""}});
  const int rc = h.Wait(p, 30);
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 1);
  CHECK(Contains(p.Err(),
                 "ddp::checkpoint::Save: this worker has no checkpoint memory "
                 "(DDPRUN_CKPT_FD is unset); run the program under ddprun"));
}

TEST_CASE("C++ and Python checkpoints are one format: each loads what the other saved",
          "[sdk][checkpoint][python]") {
  if (std::system((kPython + " -c 'import numpy' >/dev/null 2>&1").c_str()) != 0) {
    WARN("skipped: " << kPython << " cannot import numpy");
    return;
  }
  Harness h;
  // Attempt 0: C++ saves step 7. Attempt 1: Python loads it, checks the
  // bytes, saves step 8. Attempt 2: C++ loads step 8 and checks it. One
  // rank: each attempt ends by failing, and a second rank could be stopped
  // before its save (the agreement across ranks is the first case's).
  const std::string check = h.Script("check.py", R"(import sys
import numpy as np
import ddprun.checkpoint as ckpt
step, state = ckpt.load()
want = {"alpha": bytes(i % 251 for i in range(1000)), "empty": b"", "n\u00fc": b"\x01"}
assert step == 7, step
assert state == want and list(state) == list(want), state.keys()
print("PYTHON LOADED C++ OK", flush=True)
out = {"raw": bytes(range(200)), "arr": np.arange(10, dtype=np.float32)}
try:
    import torch
    out["tensor"] = torch.arange(6, dtype=torch.int64)
except ImportError:
    pass
ckpt.save(out, 8)
sys.exit(3)
)");
  const std::string run = h.Script("run.sh",
                                   "#!/bin/sh\ncase \"$TORCHELASTIC_RESTART_COUNT\" in\n"
                                   "0) exec " +
                                       Bin("ckpt_worker") +
                                       " save ;;\n"
                                       "1) exec " +
                                       kPython + " " + check +
                                       " ;;\n"
                                       "*) exec " +
                                       Bin("ckpt_worker") + " load ;;\nesac\n");
  Proc& p = h.StartDdprun("interop", {"--nproc_per_node=1", "--max_restarts=2", "--no_python", run},
                          {{"PYTHONPATH", DDPRUN_PYTHON_DIR}, {"PYTHONDONTWRITEBYTECODE", "1"}});
  const int rc = h.Wait(p, 120);
  const std::string out = p.Out();
  INFO("stdout:\n" << out << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  CHECK(Contains(out, "C++ saved 7"));
  CHECK(Contains(out, "PYTHON LOADED C++ OK"));
  CHECK(Contains(out, "C++ LOADED PYTHON OK"));
  CHECK_FALSE(Contains(out, "FAIL"));
}

TEST_CASE("C++ checkpoint: two nodes agree through the round's store; rank 1 killed saving 5",
          "[sdk][checkpoint]") {
  Harness h;
  const std::vector<std::string> worker = {Bin("ckpt_worker"), "train"};
  const std::string final_digest = CleanFinal(h, worker);
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("two_nodes");
  auto node = [&](const std::string& name, const std::string& addr) -> Proc& {
    std::vector<std::string> args = {"--nnodes=2",
                                     "--nproc_per_node=1",
                                     "--max_restarts=1",
                                     "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                     "--rdzv_id=ckpt-cpp-two-nodes",
                                     "--local_addr=" + addr,
                                     "--no_python"};
    args.insert(args.end(), worker.begin(), worker.end());
    args.insert(args.end(), {out, "8", "-1"});
    return h.StartDdprun(name, args,
                         {{"DDP_BACKEND", "gloo"},
                          {"DDP_TIMEOUT_SEC", "30"},
                          {"DDPRUN_CKPT_TEST_DIE_IN_SAVE", "1:5"}});
  };
  Proc& a = node("a", "127.0.0.1");
  Proc& b = node("b", "127.0.0.2");
  const int ra = h.Wait(a, 120);
  const int rb = h.Wait(b, 120);
  INFO("node a:\n" << a.Err() << "\nnode b:\n" << b.Err());
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
  // Rank 1 died in the middle of saving 5 after step 5's all-reduce, so
  // rank 0 (in the other node) has committed 5 unless it was stopped first:
  // each node's agent knows only its own rank's steps, and the step both
  // hold, 4, is agreed in Load() over the round's TCPStore.
  CheckResumed(out, 4, final_digest);
  h.StopDaemon(*daemon);
}
