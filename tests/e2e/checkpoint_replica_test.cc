// --ckpt_replicas 1 with real processes (issue 28 part 3): two agents as two
// nodes on loopback addresses under a real ddprund, a torch DDP (gloo)
// script saving every step; node B, whose replica sender is slowed by the
// test hook, is killed with -9 while its survivor A is a save ahead of it
// and A holds only the replica B's last save waited for (the one before its
// newest step); a hot spare C takes B's seat, restores B's snapshots from
// A's replicas (there is no --ckpt_dir at all), and both ranks resume at
// the step A still holds in its third slot, ending bit-identical with a run
// without the fault. A peer sending garbage to A's replica port meanwhile
// changes nothing. With three nodes and the middle one killed while a
// survivor is a save behind it, the spare restores both replicas its
// successor keeps and every rank resumes at the older one
// (docs/checkpoint.md, "Replica lag").
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/agent/cpu_binding.h"
#include "e2e/checkpoint_support.h"
#include "support/job_processes.h"
#include "support/process_helpers.h"
#include "support/skip.h"

namespace {

using namespace ddprun::test;
using ddprun::test::checkpoint::kPython;
using ddprun::test::checkpoint::NodeFlags;
using ddprun::test::checkpoint::TorchAvailable;
using ddprun::test::checkpoint::WorkerEnv;

// kTrainScript's DDP training, with one log per rank per node appended
// across rounds, in $REPLICA_TEST_OUT ("resumed <step> <digest>", "saved <step> <digest>",
// "final <digest>"), and, on the node given REPLICA_TEST_HOLD_AT=K, rank
// REPLICA_TEST_HOLD_RANK (default 1) holding after it saved step K (with
// REPLICA_TEST_HOLD_BEFORE_SAVE=1: after step K's all-reduce, before its
// save, and only in a worker that did not resume) until the test kills its
// node or its agent stops it. REPLICA_TEST_STEP_MS=MS lengthens each step
// by MS (its compute), so that a replica sender always picks each step
// before the next one is committed. With REPLICA_TEST_FLAT=1 the gradients are summed by
// one all_reduce of their concatenation in parameter order instead of DDP's
// buckets: the order of gloo's sums then depends only on the world size, so
// a run with three ranks whose processes were replaced ends bit-identical
// with one without the fault (DDP rebuilds its buckets in each new process).
constexpr const char* kScript = R"(import faulthandler, hashlib, os, sys, time
faulthandler.dump_traceback_later(180, exit=True)
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt

out, steps = os.environ["REPLICA_TEST_OUT"], int(sys.argv[1])
hold_at = int(os.environ.get("REPLICA_TEST_HOLD_AT", "-1"))
hold_rank = int(os.environ.get("REPLICA_TEST_HOLD_RANK", "1"))
hold_before = os.environ.get("REPLICA_TEST_HOLD_BEFORE_SAVE") == "1"
step_s = float(os.environ.get("REPLICA_TEST_STEP_MS", "0")) / 1000
flat = os.environ.get("REPLICA_TEST_FLAT") == "1"
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
ddp = model if flat else torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

def hold():
    deadline = time.monotonic() + 120   # the test kills this node long before
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(1)

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
    if flat:
        params = list(model.parameters())
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(grads)
        grads /= dist.get_world_size()
        at = 0
        for p in params:
            p.grad.copy_(grads[at:at + p.numel()].view_as(p))
            at += p.numel()
    opt.step()
    if step == hold_at and rank == hold_rank and hold_before and resumed is None:
        hold()
    time.sleep(step_s)  # a longer step: its compute
    ckpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
    log.write("saved %d %s\n" % (step, digest()))
    if step == hold_at and rank == hold_rank and not hold_before:
        hold()
log.write("final %s\n" % digest())
dist.destroy_process_group()
)";

constexpr int kSteps = 8;
constexpr int kHoldAt = 3;
// The slow sender of the two-node case: each of B's replicas leaves this
// long after B committed its step, far longer than a step takes, so a save
// of B's waits for the previous step's replica and the newest one is on its
// way whenever B is killed.
constexpr int kSlowSendMs = 1000;

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

// The test's own processes (support/job_processes.h) holding a replica's
// memory (memfd "ddprun-replica").
std::set<pid_t> ReplicaHolders(const Harness& h) {
  std::set<pid_t> holders;
  for (const auto& [pid, targets] : DescriptorHoldersNaming(h.dir(), "memfd:ddprun-replica")) {
    holders.insert(pid);
  }
  return holders;
}

// The final digest of the same training without a fault, `ranks` ranks on
// one node (every rank ends with the same parameters).
std::string CleanFinal(Harness& h, const std::string& script, int ranks,
                       const EnvList& extra = {}) {
  const std::string clean = h.MakeDir("clean");
  EnvList env = WorkerEnv();
  env.insert(env.end(), extra.begin(), extra.end());
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

// One agent of job `id` with --ckpt_replicas 1 (`ask_replicas` false: the
// flag not given, the job's value applies) on 127.0.0.<idx>, one worker, its
// log folder <name>_out.
Proc& ReplicaNode(Harness& h, const std::string& script, int port, const std::string& id,
                  int nnodes, const std::string& name, int idx, const EnvList& extra,
                  const std::string& ckpt_dir = "", bool ask_replicas = true) {
  EnvList env = WorkerEnv();
  env.insert(env.end(), extra.begin(), extra.end());
  env.push_back({"REPLICA_TEST_OUT", h.MakeDir(name + "_out")});
  std::vector<std::string> args = NodeFlags(port, id, nnodes, idx);
  args.insert(args.end(), {"--rdzv_conf=join_timeout=60", "--max_restarts=3"});
  if (ask_replicas) args.insert(args.end(), {"--ckpt_replicas", "1"});
  if (!ckpt_dir.empty()) args.push_back("--ckpt_dir=" + ckpt_dir);
  args.push_back(script);
  args.push_back(std::to_string(kSteps));
  return h.StartDdprun(name, args, env);
}

// The last access time of `path` (nanoseconds), or -1 when it has none.
std::int64_t AccessTimeNs(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<std::int64_t>(st.st_atim.tv_sec) * 1000000000 + st.st_atim.tv_nsec;
}

// "0-3,8" (a Cpus_allowed_list) -> {0, 1, 2, 3, 8}.
std::set<int> ParseCpus(const std::string& list) {
  std::set<int> cpus;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.insert(c);
  }
  return cpus;
}

// The Cpus_allowed_list of a /proc/<pid> or /proc/<pid>/task/<tid> folder.
std::set<int> CpusAllowed(const std::string& dir) {
  for (const std::string& line : Lines(ReadFile(dir + "/status"))) {
    const std::string key = "Cpus_allowed_list:";
    if (line.rfind(key, 0) == 0) {
      const auto at = line.find_first_not_of(" \t", key.size());
      return ParseCpus(at == std::string::npos ? "" : line.substr(at));
    }
  }
  return {};
}

// The agent's background checkpoint threads (comm "ckpt-..."), by name, each
// thread's CPUs.
std::map<std::string, std::vector<std::set<int>>> CheckpointThreads(pid_t agent) {
  std::map<std::string, std::vector<std::set<int>>> threads;
  const std::string task = "/proc/" + std::to_string(agent) + "/task";
  for (const std::string& tid : ListDir(task)) {
    std::string comm = ReadFile(task + "/" + tid + "/comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (comm.rfind("ckpt-", 0) == 0) threads[comm].push_back(CpusAllowed(task + "/" + tid));
  }
  return threads;
}

// `agent` runs with --cpu_bind core, one worker, --ckpt_dir and
// --ckpt_replicas 1, mid-job: its worker is bound to all cores but the last,
// and each of its background checkpoint threads (named in /proc, a receive
// thread held open by a connection that says nothing) runs on the CPUs the
// worker is not bound to (docs/checkpoint.md, "Background priority").
void CheckBackgroundCpus(Proc& agent) {
  const std::string err = agent.Err();
  std::smatch m;
  REQUIRE(std::regex_search(err, m, std::regex("listens for it on 127\\.0\\.0\\.1:(\\d+)")));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(m[1])));
  REQUIRE(::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr) == 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  pid_t worker = -1;
  for (pid_t p : Descendants(agent.pid)) {
    if (ReadFile("/proc/" + std::to_string(p) + "/cmdline").find("train.py") != std::string::npos)
      worker = p;
  }
  REQUIRE(worker > 0);
  const std::set<int> worker_cpus = CpusAllowed("/proc/" + std::to_string(worker));
  const std::vector<std::string> names{"ckpt-persist", "ckpt-send", "ckpt-accept", "ckpt-recv"};
  std::map<std::string, std::vector<std::set<int>>> threads;
  for (const auto t0 = Clock::now(); SecondsSince(t0) < 10; SleepMs(20)) {
    threads = CheckpointThreads(agent.pid);
    if (threads.size() == names.size()) break;
  }
  for (const std::string& name : names) {
    INFO(name);
    REQUIRE(threads.count(name) == 1);
  }
  const auto topology = ddprun::agent::ReadCpuTopology();
  if (topology.cores.size() < 2) {
    // One core: the worker has it all, the threads share it, said once.
    WARN(
        "SKIPPED [e2e]: the background threads' CPUs: fewer than 2 usable cores, so no core "
        "is left for them (the agent's line is checked instead)");
    CHECK(err.find("is free of workers, so the background checkpoint threads share") !=
          std::string::npos);
    return;
  }
  std::set<int> spare;
  for (const auto& core : topology.cores) spare.insert(core.begin(), core.end());
  const std::vector<int> last = topology.cores.back();
  INFO("worker on " << ddprun::agent::FormatCpuList({worker_cpus.begin(), worker_cpus.end()}));
  for (int c : last) CHECK(worker_cpus.count(c) == 0);
  for (int c : worker_cpus) spare.erase(c);
  REQUIRE_FALSE(spare.empty());
  for (const auto& [name, sets] : threads) {
    for (const std::set<int>& cpus : sets) {
      INFO(name << " on " << ddprun::agent::FormatCpuList({cpus.begin(), cpus.end()}));
      CHECK(cpus == spare);
    }
  }
  CHECK(err.find("run on CPU(s) " + ddprun::agent::FormatCpuList({spare.begin(), spare.end()}) +
                 ", which no worker is bound to") != std::string::npos);
}

}  // namespace

TEST_CASE(
    "ckpt_replicas: kill -9 of a node whose replica sender is slow while its survivor is a save "
    "ahead; a hot spare restores its seat from the peer replicas and both ranks resume "
    "bit-identical at the step the survivor keeps in its third slot",
    "[e2e][checkpoint][replicas]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string script = h.Script("train.py", kScript);

  const std::string final0 = CleanFinal(h, script, 2);

  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  auto node = [&](const std::string& name, int idx, const EnvList& extra,
                  bool ask_replicas = true) -> Proc& {
    return ReplicaNode(h, script, port, "replicas", 2, name, idx, extra, "", ask_replicas);
  };
  // A's agent says (DDPRUN_DEBUG=agent) when it holds a replica. B's
  // sender is slow (the test hook: each replica waits kSlowSendMs before it
  // goes), as a loaded link would be, and B's rank 1 holds after step 3's
  // all-reduce, before its save: B returned from save(2), which waited for
  // the replica of step 1 (docs/checkpoint.md, "Replica lag"); step 2's is
  // still on its way. A's rank 0 saves step 3 meanwhile: A holds steps 1, 2
  // and 3 and A's store B's replicas of steps 0 and 1. Step 1 is then the
  // only step both hold: in A's third slot (with two slots A holds 2 and 3,
  // and the job starts over), and in the replica before B's newest.
  constexpr int kLast = kHoldAt - 2;  // the newest replica of B's at its loss
  Proc& a = node("A", 1, {{"DDPRUN_DEBUG", "agent"}});
  // B's steps take 200 ms more: its sender, done with a step, picks the
  // next one before B commits the one after it (it sends the newest
  // committed step, and would skip one otherwise).
  Proc& b = node("B", 2,
                 {{"REPLICA_TEST_HOLD_AT", std::to_string(kHoldAt)},
                  {"REPLICA_TEST_HOLD_BEFORE_SAVE", "1"},
                  {"REPLICA_TEST_STEP_MS", "200"},
                  {"DDPRUN_CKPT_TEST_REPLICA_DELAY_MS", std::to_string(kSlowSendMs)}});
  const std::string a_out = h.dir() + "/A_out", b_out = h.dir() + "/B_out",
                    c_out = h.dir() + "/C_out";
  // A's rank 0 saved step 3: B's rank 1 holds before its save of step 3.
  const std::string saved = "saved " + std::to_string(kHoldAt) + " ";
  const auto t_hold = Clock::now();
  while (ReadFile(a_out + "/rank0.txt").find(saved) == std::string::npos &&
         SecondsSince(t_hold) < 60 && !b.exit && !a.exit) {
    SleepMs(20);
  }
  INFO("A stderr:\n" << a.Err() << "\nB stderr:\n" << b.Err());
  REQUIRE(ReadFile(a_out + "/rank0.txt").find(saved) != std::string::npos);
  CHECK(WaitForErr(a, "holds the replica of step " + std::to_string(kLast) + " of rank 1", 10));
  // The replica is in memory only A's agent holds (ddprun and its orphan
  // guard, which shares its descriptors), never a worker.
  const std::set<pid_t> holders = ReplicaHolders(h);
  CHECK(holders.count(a.pid) == 1);
  for (pid_t pid : holders) {
    const std::string cmd = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    INFO("holder " << pid << ": " << cmd);
    CHECK(cmd.rfind(Ddprun(), 0) == 0);
  }
  // B is lost while the replica of its step 2 is still on its way (the
  // sender's kSlowSendMs, from B's return from save(2)); a spare then joins,
  // without --ckpt_replicas (the job's value, the first node's, holds for
  // it, and it is told so).
  REQUIRE(::kill(b.pid, SIGKILL) == 0);
  const std::string a_at_kill = a.Err();
  CHECK(h.Wait(b, 10) == 128 + SIGKILL);
  CHECK(a_at_kill.find("holds the replica of step " + std::to_string(kLast + 1) + " of rank 1") ==
        std::string::npos);
  Proc& c = node("C", 3, {}, /*ask_replicas=*/false);

  // C joins as the node the re-forming round waits for, and takes B's seat
  // (group ranks follow the hosts: 127.0.0.1, then 127.0.0.3).

  // Garbage on A's replica port: each connection dropped, at most a line a
  // second, and the job goes on.
  std::smatch m;
  const std::string a_err = a.Err();
  REQUIRE(std::regex_search(a_err, m, std::regex("listens for it on 127\\.0\\.0\\.1:(\\d+)")));
  const int replica_port = std::stoi(m[1]);
  CHECK(a_err.find("; replicas cross encrypted (AES-256-GCM)") !=
        std::string::npos);  // the default
  for (int i = 0; i < 5; ++i) SendGarbage("127.0.0.1", replica_port, "GET / HTTP/1.0\r\n\r\n");
  SendGarbage("127.0.0.1", replica_port, std::string("DDPREPL1\x01\0\0\0\xff\xff\xff\x7f", 16));
  REQUIRE(WaitForErr(a, "--ckpt_replicas: dropped a connection from 127.0.0.1:", 10));

  for (Proc* p : {&a, &c}) {
    const int rc = h.Wait(*p, 180);
    INFO(p->name << " stderr:\n" << p->Err());
    CHECK(rc == 0);
  }
  INFO("A stderr:\n" << a.Err() << "\nC stderr:\n" << c.Err());
  CHECK(c.Err().find("this node asked ckpt_replicas=0, the job runs with 1 (the first node's); "
                     "pass the same --ckpt_replicas on every node") != std::string::npos);
  // C restored B's seat from A's replicas, steps 0 and 1; no --ckpt_dir was
  // given at all. B's save of step 2 returned once A held step 1's.
  const std::string c_err = c.Err();
  REQUIRE(std::regex_search(
      c_err, m,
      std::regex("--ckpt_replicas: restored step (\\d+) of rank 1 from the replica held by "
                 "127\\.0\\.0\\.1:" +
                 std::to_string(replica_port) +
                 " \\(with step (\\d+) before it; nothing read from storage\\)")));
  const int restored = std::stoi(m[1]);
  CHECK(restored == kLast);
  CHECK(std::stoi(m[2]) == kLast - 1);
  const std::string a_log = ReadFile(a_out + "/rank0.txt");
  const std::string b_log = ReadFile(b_out + "/rank1.txt");
  const std::string c_log = ReadFile(c_out + "/rank1.txt");
  INFO("A rank 0:\n" << a_log << "B rank 1:\n" << b_log << "C rank 1:\n" << c_log);
  const std::string k = std::to_string(kLast);
  // Both resume at step 1, which A kept in its third slot, with what was
  // saved there; A had saved two steps more.
  REQUIRE_FALSE(Field(b_log, "saved " + k).empty());
  CHECK(Field(b_log, "saved " + std::to_string(kHoldAt)).empty());
  CHECK(Field(c_log, "resumed " + k) == Field(b_log, "saved " + k));
  CHECK(Field(a_log, "resumed " + k) == Field(a_log, "saved " + k));
  CHECK(Field(c_log, "saved " + std::to_string(kHoldAt + 1)).size() == 64);
  // And end as the run without the fault.
  CHECK(Field(a_log, "final") == final0);
  CHECK(Field(c_log, "final") == final0);
  // The replicas' memory went with the agents.
  CHECK(ReplicaHolders(h).empty());
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

// Three nodes, the middle one lost while a survivor is a save behind it:
// B's rank 1 holds after saving step 3 and C's rank 2 after step 3's
// all-reduce, before its save; C holds B's replica of step 3 and the one
// before it (step 2, or step 1 when B's sender skipped step 2 under load:
// it sends the newest committed step). The survivors keep their seats (A
// rank 0, C rank 2) and the spare S takes B's, restoring both replicas from
// C: the older one is the newest step every rank holds (C never saved 3),
// so all resume there, with the bytes saved there. A receiver that kept
// only B's newest replica (3) leaves no step in common.
TEST_CASE(
    "ckpt_replicas: three nodes, the middle one killed while a survivor is a save behind; "
    "the spare restores the two replicas its successor keeps and all resume at the older",
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
  EnvList c_env = debug;
  c_env.insert(c_env.end(), {{"REPLICA_TEST_HOLD_AT", std::to_string(kHoldAt)},
                             {"REPLICA_TEST_HOLD_RANK", "2"},
                             {"REPLICA_TEST_HOLD_BEFORE_SAVE", "1"}});
  Proc& c = ReplicaNode(h, script, port, "three", 3, "C", 3, c_env);
  const std::string k = std::to_string(kHoldAt);
  // C holds B's (rank 1) replicas of steps 2 and 3.
  const bool held = WaitForErr(c, "holds the replica of step " + k + " of rank 1", 120);
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
  std::smatch m;
  const std::string s_err = s.Err();
  REQUIRE(std::regex_search(s_err, m,
                            std::regex("of rank 1 from the replica held by 127\\.0\\.0\\.3:\\d+ "
                                       "\\(with step (\\d+) before it; nothing read from "
                                       "storage\\)")));
  const std::string k1 = m[1];
  CHECK((std::stoi(k1) == kHoldAt - 1 || std::stoi(k1) == kHoldAt - 2));
  const std::string dir = h.dir();
  const std::string b_rank1 = ReadFile(dir + "/B_out/rank1.txt");
  const std::string c_rank2 = ReadFile(dir + "/C_out/rank2.txt");
  const std::string a_rank0 = ReadFile(dir + "/A_out/rank0.txt");
  const std::string s_rank1 = ReadFile(dir + "/S_out/rank1.txt");
  INFO("B rank 1:\n" << b_rank1 << "C rank 2:\n" << c_rank2 << "S rank 1:\n" << s_rank1);
  REQUIRE_FALSE(Field(b_rank1, "saved " + k).empty());
  CHECK(Field(a_rank0, "resumed " + k1) == Field(a_rank0, "saved " + k1));
  CHECK(Field(s_rank1, "resumed " + k1) == Field(b_rank1, "saved " + k1));
  CHECK(Field(c_rank2, "resumed " + k1) == Field(c_rank2, "saved " + k1));
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

// Three nodes with --ckpt_replicas 1 and --ckpt_dir, the last one (C, rank
// 2) lost: a hot spare S (127.0.0.4, sorting after the survivors) takes its
// seat and restores it from the replica A holds (A is C's successor), with
// the same bytes; its own --ckpt_dir holds a complete copy of C's persisted
// snapshots, which it must not read (the replica comes first): the files'
// access times, on a tmpfs mounted with strictatime, do not move. A sends
// the older of its two replicas corrupt (the test hook): the spare refuses
// that one by its checksum and restores the newer one alone. Every rank
// ends bit-identical with a run without the fault (gradients summed in one
// fixed layout: REPLICA_TEST_FLAT). A runs with --cpu_bind core: mid-job its
// background checkpoint threads run only where its worker is not bound
// (CheckBackgroundCpus).
TEST_CASE(
    "ckpt_replicas: three nodes, the last one killed; a hot spare restores its seat from the "
    "replica, reads nothing from --ckpt_dir and ends bit-identical",
    "[e2e][checkpoint][replicas]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string dirs = h.MakeDir("dirs");
  if (::mount("tmpfs", dirs.c_str(), "tmpfs", MS_STRICTATIME, "size=64m,mode=0700") != 0) {
    return SkipCase("e2e", std::string("cannot mount a tmpfs with strictatime (") +
                               std::strerror(errno) + "); needs root");
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dirs};
  const std::string script = h.Script("train.py", kScript);
  const EnvList flat{{"REPLICA_TEST_FLAT", "1"}};
  const std::string final0 = CleanFinal(h, script, 3, flat);

  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string k = std::to_string(kHoldAt);
  EnvList a_env = flat, c_env = flat;
  a_env.push_back({"DDPRUN_DEBUG", "agent"});
  // A corrupts the older replica it sends to a restore (the test hook): the
  // spare refuses it and restores the newer one alone.
  a_env.push_back({"DDPRUN_CKPT_TEST_REPLICA_CORRUPT_OLDER", "1"});
  a_env.push_back({"PET_CPU_BIND", "core"});  // CheckBackgroundCpus
  c_env.push_back({"REPLICA_TEST_HOLD_AT", k});
  c_env.push_back({"REPLICA_TEST_HOLD_RANK", "2"});
  Proc& a = ReplicaNode(h, script, port, "spare3", 3, "A", 1, a_env, dirs + "/A");
  Proc& b = ReplicaNode(h, script, port, "spare3", 3, "B", 2, flat, dirs + "/B");
  Proc& c = ReplicaNode(h, script, port, "spare3", 3, "C", 3, c_env, dirs + "/C");
  // C's rank 2 holds after saving step 3; A holds its replica, and C's
  // directory its persisted files of step 3.
  namespace fs = std::filesystem;
  const fs::path c_step = fs::path(dirs) / "C" / ("step-" + k);
  bool ready = WaitForErr(a, "holds the replica of step " + k + " of rank 2", 120);
  for (int i = 0; ready && i < 1500 && !fs::exists(c_step / "rank-00002.safetensors"); ++i) {
    SleepMs(20);
  }
  INFO("A stderr:\n" << a.Err() << "\nC stderr:\n" << c.Err());
  REQUIRE(ready);
  REQUIRE(fs::exists(c_step / "rank-00002.safetensors"));
  CheckBackgroundCpus(a);
  // S's directory: a copy of C's, a resume S could read but must not; the
  // files are also linked from `seen` so their access times outlive any
  // clean-up of S's persister.
  const fs::path s_dir = fs::path(dirs) / "S", seen = fs::path(dirs) / "seen";
  fs::copy(fs::path(dirs) / "C", s_dir, fs::copy_options::recursive);
  fs::create_directory(seen);
  std::map<std::string, std::int64_t> atimes;
  for (const auto& e : fs::recursive_directory_iterator(s_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name =
        e.path().parent_path().filename().string() + "_" + e.path().filename().string();
    fs::create_hard_link(e.path(), seen / name);
    atimes[(seen / name).string()] = AccessTimeNs((seen / name).string());
  }
  REQUIRE(atimes.count((seen / ("step-" + k + "_rank-00002.safetensors")).string()) == 1);
  Proc& s = ReplicaNode(h, script, port, "spare3", 3, "S", 4, flat, s_dir.string());
  REQUIRE(::kill(c.pid, SIGKILL) == 0);
  CHECK(h.Wait(c, 10) == 128 + SIGKILL);
  for (Proc* p : {&a, &b, &s}) {
    const int rc = h.Wait(*p, 180);
    INFO(p->name << " stderr:\n" << p->Err());
    CHECK(rc == 0);
  }
  INFO("S stderr:\n" << s.Err());
  // The older replica failed its checksum: one fenced line naming A, the
  // rank, the step and the cause; step 3 alone was restored.
  std::smatch m;
  const std::string s_err = s.Err();
  REQUIRE(std::regex_search(
      s_err, m,
      std::regex(
          "\\[job spare3 round \\d+\\] --ckpt_replicas: cannot restore step (\\d+) of rank 2 "
          "from the replica held by (127\\.0\\.0\\.1:\\d+): the replica of step \\1 of rank 2 "
          "from \\2 does not match its checksum; that step is not offered to load\\(\\)")));
  CHECK(std::stoi(m[1]) < kHoldAt);
  CHECK(s_err.find("--ckpt_replicas: restored step " + k + " of rank 2 from the replica held by " +
                   std::string(m[2]) + " (nothing read from storage)") != std::string::npos);
  const std::string dir = h.dir();
  const std::string c_rank2 = ReadFile(dir + "/C_out/rank2.txt");
  const std::string s_rank2 = ReadFile(dir + "/S_out/rank2.txt");
  const std::string a_rank0 = ReadFile(dir + "/A_out/rank0.txt");
  const std::string b_rank1 = ReadFile(dir + "/B_out/rank1.txt");
  INFO("C rank 2:\n" << c_rank2 << "S rank 2:\n" << s_rank2 << "A rank 0:\n" << a_rank0);
  REQUIRE_FALSE(Field(c_rank2, "saved " + k).empty());
  CHECK(Field(s_rank2, "resumed " + k) == Field(c_rank2, "saved " + k));
  CHECK(Field(a_rank0, "resumed " + k) == Field(a_rank0, "saved " + k));
  CHECK(Field(b_rank1, "resumed " + k) == Field(b_rank1, "saved " + k));
  // Bit-identical with the run without the fault, on every rank.
  CHECK(Field(a_rank0, "final") == final0);
  CHECK(Field(b_rank1, "final") == final0);
  CHECK(Field(s_rank2, "final") == final0);
  // Nothing S's directory held before it started was read.
  for (const auto& [path, before] : atimes) {
    INFO(path);
    CHECK(AccessTimeNs(path) == before);
  }
  // (The access times do move on a read: the check above can fail.)
  const std::string probe = (seen / ("step-" + k + "_rank-00002.safetensors")).string();
  const std::int64_t unread = AccessTimeNs(probe);
  SleepMs(10);
  CHECK_FALSE(ReadFile(probe).empty());
  CHECK(AccessTimeNs(probe) > unread);
  h.StopDaemon(*daemon);
}
