// --ckpt_replicas 1 with real processes (issue 28 part 3): two agents as two
// nodes on loopback addresses under a real ddprund, a torch DDP (gloo)
// script saving every step; node B is killed with -9 while the replica of
// its newest step is on node A; a hot spare C takes B's seat, restores B's
// snapshot from A's replica (there is no --ckpt_dir at all) and both ranks
// resume at that step, ending bit-identical with a run without the fault. A
// peer sending garbage to A's replica port meanwhile changes nothing. With
// three nodes and the middle one killed, the ranks shift and every seat is
// restored from the replica that holds it (one of them the node's own).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "e2e/checkpoint_support.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using namespace ddprun::test;
using ddprun::test::checkpoint::kPython;
using ddprun::test::checkpoint::TorchAvailable;
using ddprun::test::checkpoint::WorkerEnv;

// kTrainScript's DDP training, with one log per rank per node appended
// across rounds, in $REPLICA_TEST_OUT ("resumed <step> <digest>", "saved <step> <digest>",
// "final <digest>"), and, on the node given REPLICA_TEST_HOLD_AT=K, rank 1
// holding after it saved step K (until the test kills its node).
constexpr const char* kScript = R"(import faulthandler, hashlib, os, sys, time
faulthandler.dump_traceback_later(180, exit=True)
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt

out, steps = os.environ["REPLICA_TEST_OUT"], int(sys.argv[1])
hold_at = int(os.environ.get("REPLICA_TEST_HOLD_AT", "-1"))
rank = int(os.environ["RANK"])
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

log = open(os.path.join(out, "rank%d.txt" % rank), "a", buffering=1)
start = 0
resumed = ckpt.load()
if resumed is not None:
    step, state = resumed
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = step + 1
    log.write("resumed %d %s\n" % (step, digest()))
for step in range(start, steps):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    ckpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
    log.write("saved %d %s\n" % (step, digest()))
    if step == hold_at and rank == 1:
        deadline = time.monotonic() + 120   # the test kills this node long before
        while time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(1)
log.write("final %s\n" % digest())
dist.destroy_process_group()
)";

constexpr int kSteps = 8;
constexpr int kHoldAt = 3;

// The value after "<word> <step> " in a rank's log (the last such line).
std::string Field(const std::string& log, const std::string& key) {
  std::string found;
  for (const std::string& line : Lines(log)) {
    if (line.rfind(key + " ", 0) == 0) found = line.substr(key.size() + 1);
  }
  return found;
}

// Waits until `p`'s stderr contains `text` (deadline `timeout_s`).
bool WaitForErr(Proc& p, const std::string& text, double timeout_s) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < timeout_s) {
    if (p.Err().find(text) != std::string::npos) return true;
    if (p.exit) return false;
    SleepMs(20);
  }
  return false;
}

// Connects to host:port and sends `bytes`, then closes.
void SendGarbage(const std::string& host, int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  REQUIRE(::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  (void)!::write(fd, bytes.data(), bytes.size());
  ::close(fd);
}

// The processes holding a replica's memory (memfd "ddprun-replica").
std::set<pid_t> ReplicaHolders() {
  std::set<pid_t> holders;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return holders;
  while (dirent* p = ::readdir(proc)) {
    const int pid = std::atoi(p->d_name);
    if (pid <= 0) continue;
    const std::string fd_dir = std::string("/proc/") + p->d_name + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = ::readdir(fds)) {
      char target[256] = {};
      const ssize_t n = ::readlink((fd_dir + "/" + f->d_name).c_str(), target, sizeof target - 1);
      if (n > 0 && std::string(target, n).find("memfd:ddprun-replica") != std::string::npos) {
        holders.insert(pid);
      }
    }
    ::closedir(fds);
  }
  ::closedir(proc);
  return holders;
}

// The final digest of the same training without a fault, `ranks` ranks on
// one node (every rank ends with the same parameters).
std::string CleanFinal(Harness& h, const std::string& script, int ranks) {
  const std::string clean = h.MakeDir("clean");
  EnvList env = WorkerEnv();
  env.push_back({"REPLICA_TEST_OUT", clean});
  Proc& ref = h.StartDdprun(
      "clean", {"--nproc_per_node=" + std::to_string(ranks), script, std::to_string(kSteps)}, env);
  REQUIRE(h.Wait(ref, 240) == 0);
  const std::string final0 = Field(ReadFile(clean + "/rank0.txt"), "final");
  REQUIRE(final0.size() == 64);
  for (int r = 1; r < ranks; ++r) {
    REQUIRE(Field(ReadFile(clean + "/rank" + std::to_string(r) + ".txt"), "final") == final0);
  }
  return final0;
}

// One agent of job `id` with --ckpt_replicas 1 on 127.0.0.<idx>, one
// worker, its log folder <name>_out.
Proc& ReplicaNode(Harness& h, const std::string& script, int port, const std::string& id,
                  int nnodes, const std::string& name, int idx, const EnvList& extra) {
  EnvList env = WorkerEnv();
  env.insert(env.end(), extra.begin(), extra.end());
  env.push_back({"REPLICA_TEST_OUT", h.MakeDir(name + "_out")});
  return h.StartDdprun(name,
                       {"--nnodes=" + std::to_string(nnodes), "--nproc_per_node=1",
                        "--local_addr=127.0.0." + std::to_string(idx),
                        "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=" + id,
                        "--rdzv_conf=join_timeout=60", "--max_restarts=3", "--ckpt_replicas", "1",
                        script, std::to_string(kSteps)},
                       env);
}

}  // namespace

TEST_CASE(
    "ckpt_replicas: kill -9 of a node; a hot spare restores its seat from the peer "
    "replica and both ranks resume bit-identical",
    "[e2e][checkpoint][replicas]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string script = h.Script("train.py", kScript);

  const std::string final0 = CleanFinal(h, script, 2);

  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  auto node = [&](const std::string& name, int idx, const EnvList& extra) -> Proc& {
    EnvList env = WorkerEnv();
    env.insert(env.end(), extra.begin(), extra.end());
    env.push_back({"REPLICA_TEST_OUT", h.MakeDir(name + "_out")});
    return h.StartDdprun(
        name,
        {"--nnodes=2", "--nproc_per_node=1", "--local_addr=127.0.0." + std::to_string(idx),
         "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=replicas",
         "--rdzv_conf=join_timeout=60", "--max_restarts=3", "--ckpt_replicas", "1", script,
         std::to_string(kSteps)},
        env);
  };
  // A's agent says (DDPRUN_DEBUG=agent) when it holds a replica.
  Proc& a = node("A", 1, {{"DDPRUN_DEBUG", "agent"}});
  Proc& b = node("B", 2, {{"REPLICA_TEST_HOLD_AT", std::to_string(kHoldAt)}});
  const std::string a_out = h.dir() + "/A_out", b_out = h.dir() + "/B_out",
                    c_out = h.dir() + "/C_out";
  // B's rank 1 holds after saving step 3; A holds the replica of it.
  const std::string held = "holds the replica of step " + std::to_string(kHoldAt) + " of rank 1";
  const bool holds = WaitForErr(a, held, 60);
  INFO("A stderr:\n" << a.Err() << "\nB stderr:\n" << b.Err());
  REQUIRE(holds);
  // The replica is in memory only A's agent holds (ddprun and its orphan
  // guard, which shares its descriptors), never a worker.
  const std::set<pid_t> holders = ReplicaHolders();
  CHECK(holders.count(a.pid) == 1);
  for (pid_t pid : holders) {
    const std::string cmd = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    INFO("holder " << pid << ": " << cmd);
    CHECK(cmd.rfind(Ddprun(), 0) == 0);
  }
  // A spare joins the running round.
  Proc& c = node("C", 3, {});

  // Garbage on A's replica port: each connection dropped, at most a line a
  // second, and the job goes on.
  std::smatch m;
  const std::string a_err = a.Err();
  REQUIRE(std::regex_search(a_err, m, std::regex("listens for it on 127\\.0\\.0\\.1:(\\d+)")));
  const int replica_port = std::stoi(m[1]);
  for (int i = 0; i < 5; ++i) SendGarbage("127.0.0.1", replica_port, "GET / HTTP/1.0\r\n\r\n");
  SendGarbage("127.0.0.1", replica_port, std::string("DDPREPL1\x01\0\0\0\xff\xff\xff\x7f", 16));
  REQUIRE(WaitForErr(a, "--ckpt_replicas: dropped a connection from 127.0.0.1:", 10));

  // C joins as a hot spare of the full round, or, if B's loss is seen
  // first, as the node the re-forming round waits for: C takes B's seat
  // either way (group ranks follow the hosts: 127.0.0.1, then 127.0.0.3).
  REQUIRE(::kill(b.pid, SIGKILL) == 0);
  CHECK(h.Wait(b, 10) == 128 + SIGKILL);

  for (Proc* p : {&a, &c}) {
    const int rc = h.Wait(*p, 180);
    INFO(p->name << " stderr:\n" << p->Err());
    CHECK(rc == 0);
  }
  INFO("A stderr:\n" << a.Err() << "\nC stderr:\n" << c.Err());
  // C restored B's seat from A's replica; no --ckpt_dir was given at all.
  CHECK(
      c.Err().find("--ckpt_replicas: restored step " + std::to_string(kHoldAt) +
                   " of rank 1 from the replica held by 127.0.0.1:" + std::to_string(replica_port) +
                   " (nothing read from storage)") != std::string::npos);
  const std::string a_log = ReadFile(a_out + "/rank0.txt");
  const std::string b_log = ReadFile(b_out + "/rank1.txt");
  const std::string c_log = ReadFile(c_out + "/rank1.txt");
  INFO("A rank 0:\n" << a_log << "B rank 1:\n" << b_log << "C rank 1:\n" << c_log);
  const std::string k = std::to_string(kHoldAt);
  // Both resume at the step B had replicated, with what was saved there.
  REQUIRE_FALSE(Field(b_log, "saved " + k).empty());
  CHECK(Field(c_log, "resumed " + k) == Field(b_log, "saved " + k));
  CHECK(Field(a_log, "resumed " + k) == Field(a_log, "saved " + k));
  CHECK(Field(c_log, "saved " + std::to_string(kHoldAt + 1)).size() == 64);
  // And end as the run without the fault.
  CHECK(Field(a_log, "final") == final0);
  CHECK(Field(c_log, "final") == final0);
  // The replicas' memory went with the agents.
  CHECK(ReplicaHolders().empty());
  // Garbage: dropped, at most one line a second (7 connections in well under 2 s).
  std::size_t dropped = 0;
  for (const std::string& line : Lines(a.Err())) {
    if (line.find("--ckpt_replicas: dropped a connection") != std::string::npos) ++dropped;
  }
  CHECK(dropped >= 1);
  CHECK(dropped <= 2);
  h.StopDaemon(*daemon);
}

TEST_CASE(
    "ckpt_replicas: a bad value or no checkpoint memory is one line and exit 2; one node "
    "runs as without it",
    "[e2e][checkpoint][replicas]") {
  Harness h;
  Proc& bad = h.StartDdprun(
      "bad", {"--standalone", "--nproc_per_node=1", "--ckpt_replicas", "2", "/bin/true"});
  CHECK(h.Wait(bad, 20) == 2);
  Proc& env = h.StartDdprun("env", {"--standalone", "--nproc_per_node=1", "/bin/true"},
                            {{"PET_CKPT_REPLICAS", "2"}});
  CHECK(h.Wait(env, 20) == 2);
  INFO("flag:\n" << bad.Err() << "\nvariable:\n" << env.Err());
  CHECK(Lines(bad.Err()).size() == 1);
  CHECK(bad.Err().find("0 or 1") != std::string::npos);
  CHECK(env.Err().find("PET_CKPT_REPLICAS") != std::string::npos);
  CHECK(env.Err().find("0 or 1") != std::string::npos);

  Proc& nomem = h.StartDdprun("nomem", {"--standalone", "--nproc_per_node=1", "--ckpt_replicas",
                                        "1", "--ckpt_shm_limit", "0", "/bin/true"});
  CHECK(h.Wait(nomem, 20) == 2);
  INFO(nomem.Err());
  CHECK(nomem.Err().find("--ckpt_replicas 1 needs checkpoint memory; drop --ckpt_shm_limit 0") !=
        std::string::npos);
  CHECK(Lines(nomem.Err()).size() == 1);

  Proc& one = h.StartDdprun(
      "one", {"--standalone", "--nproc_per_node=2", "--ckpt_replicas", "1", "/bin/true"});
  CHECK(h.Wait(one, 20) == 0);
  INFO(one.Err());
  CHECK(one.Err().find("cannot") == std::string::npos);
}

// Three nodes, the middle one lost: the group ranks shift (A 127.0.0.1, C
// 127.0.0.3 and the spare S 127.0.0.4 become 0, 1, 2), so C restores B's
// seat (rank 1) from the replica it holds itself, and S restores C's old
// seat (rank 2) from the replica A holds: every rank resumes at the step
// B had replicated, with the bytes saved there.
TEST_CASE(
    "ckpt_replicas: three nodes, the middle one killed; the survivors keep their seats and "
    "the spare's is restored from the replica",
    "[e2e][checkpoint][replicas]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string script = h.Script("train.py", kScript);
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const EnvList debug{{"DDPRUN_DEBUG", "agent"}};
  Proc& a = ReplicaNode(h, script, port, "three", 3, "A", 1, debug);
  Proc& b = ReplicaNode(h, script, port, "three", 3, "B", 2,
                        {{"REPLICA_TEST_HOLD_AT", std::to_string(kHoldAt)}});
  Proc& c = ReplicaNode(h, script, port, "three", 3, "C", 3, debug);
  const std::string k = std::to_string(kHoldAt);
  // A holds C's replica (rank 2), C holds B's (rank 1), both of step 3.
  const bool held = WaitForErr(a, "holds the replica of step " + k + " of rank 2", 120) &&
                    WaitForErr(c, "holds the replica of step " + k + " of rank 1", 30);
  INFO("A stderr:\n" << a.Err() << "\nC stderr:\n" << c.Err());
  REQUIRE(held);
  Proc& s = ReplicaNode(h, script, port, "three", 3, "S", 4, {});
  REQUIRE(::kill(b.pid, SIGKILL) == 0);
  CHECK(h.Wait(b, 10) == 128 + SIGKILL);
  for (Proc* p : {&a, &c, &s}) {
    const int rc = h.Wait(*p, 180);
    INFO(p->name << " stderr:\n" << p->Err());
    CHECK(rc == 0);
  }
  INFO("S stderr:\n" << s.Err());
  // Seats are kept (docs/architecture.md): A and C keep ranks 0 and 2 and
  // their own memory; the spare takes B's seat, rank 1, from C's replica.
  CHECK(c.Err().find("--ckpt_replicas: restored") == std::string::npos);
  CHECK(s.Err().find("--ckpt_replicas: restored step " + k +
                     " of rank 1 from the replica held by " + "127.0.0.3:") != std::string::npos);
  const std::string dir = h.dir();
  const std::string b_rank1 = ReadFile(dir + "/B_out/rank1.txt");
  const std::string c_rank2 = ReadFile(dir + "/C_out/rank2.txt");
  const std::string a_rank0 = ReadFile(dir + "/A_out/rank0.txt");
  const std::string s_rank1 = ReadFile(dir + "/S_out/rank1.txt");
  INFO("B rank 1:\n" << b_rank1 << "C rank 2:\n" << c_rank2 << "S rank 1:\n" << s_rank1);
  REQUIRE_FALSE(Field(b_rank1, "saved " + k).empty());
  CHECK(Field(a_rank0, "resumed " + k) == Field(a_rank0, "saved " + k));
  CHECK(Field(s_rank1, "resumed " + k) == Field(b_rank1, "saved " + k));
  CHECK(Field(c_rank2, "resumed " + k) == Field(c_rank2, "saved " + k));
  // Every rank trained on from there and ends with the same parameters. Not
  // compared with a run without the fault, unlike the two-node case: with
  // three ranks the order of gloo's ring sums follows DDP's bucket layout,
  // which DDP rebuilds on the first step of each new process (step 4 here,
  // step 0 there), so the two runs differ in the last bits after step 4.
  const std::string final0 = Field(a_rank0, "final");
  CHECK(final0.size() == 64);
  CHECK(Field(c_rank2, "final") == final0);
  CHECK(Field(s_rank1, "final") == final0);
  CHECK(Field(s_rank1, "saved " + std::to_string(kHoldAt + 1)).size() == 64);
  h.StopDaemon(*daemon);
}
