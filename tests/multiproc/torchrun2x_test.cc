// torchrun 2.x command lines, run unchanged with real ddprun processes: one
// test per row of docs/cli.md's compatibility table that this tier covers,
// named "torchrun 2.x row: <the flag or variable>". What each expects is what
// torch 2.11's own torchrun did with the same line on a GPU machine
// (tests/gpu/torchrun_side_by_side.py; docs/gpu.md lists every difference).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

// A worker that prints what torchrun's contract gives it, one line per rank:
// ENV rank=R local_rank=L cvd=[...] error_file=[...|unset] signals=[...]
const char* kEnvWorker = R"(#!/bin/sh
echo "ENV rank=$RANK local_rank=$LOCAL_RANK cvd=[${CUDA_VISIBLE_DEVICES-unset}] error_file=[${TORCHELASTIC_ERROR_FILE-unset}] signals=[$TORCHELASTIC_SIGNALS_TO_HANDLE]"
if [ -n "$PIDDIR" ]; then
  trap '' TERM
  echo $$ > "$PIDDIR/$RANK.pid"
  while :; do sleep 1; done
fi
exit 0
)";

std::string WriteWorker(Harness& h) { return h.Script("env_worker.sh", kEnvWorker); }

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("torchrun 2.x row: --rdzv-endpoint=localhost:0 (stock LLM launch line)", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p = h.StartDdprun("ddprun", {"--nnodes=1", "--nproc_per_node=2", "--rdzv_backend", "c10d",
                                     "--rdzv_endpoint=localhost:0", "--local-ranks-filter", "0",
                                     "--role", "rank", "--tee", "3", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "ENV rank=0 local_rank=0"));
  CHECK_FALSE(Has(p.Out(), "ENV rank=1"));  // --local-ranks-filter 0
  // Two such jobs at once on one host never collide: the OS picks each port.
  Proc& a = h.StartDdprun("a", {"--rdzv_endpoint=localhost:0", "--nproc_per_node=2", w});
  Proc& b = h.StartDdprun("b", {"--rdzv_endpoint=localhost:0", "--nproc_per_node=2", w});
  CHECK(h.Wait(a, 20) == 0);
  CHECK(h.Wait(b, 20) == 0);
}

TEST_CASE("torchrun 2.x row: --log-dir /dev/null", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p = h.StartDdprun(
      "ddprun", {"--standalone", "--nproc_per_node=2", "--log-dir", "/dev/null", "--tee", "3", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  // torch 2.11: TORCHELASTIC_ERROR_FILE is set and empty; no files anywhere.
  CHECK(Has(p.Out(), "ENV rank=0 local_rank=0 cvd=[unset] error_file=[] "));
  CHECK(Has(p.Out(), "ENV rank=1 local_rank=1 cvd=[unset] error_file=[] "));
  CHECK_FALSE(Has(p.Err(), "worker logs in"));
}

TEST_CASE("torchrun 2.x row: --virtual-local-rank", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p =
      h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", "--virtual-local-rank", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "ENV rank=0 local_rank=0 cvd=[0]"));
  CHECK(Has(p.Out(), "ENV rank=1 local_rank=0 cvd=[1]"));
  Proc& q =
      h.StartDdprun("ddprun2", {"--standalone", "--nproc_per_node=2", "--virtual_local_rank", w},
                    {{"CUDA_VISIBLE_DEVICES", "5,7"}});
  REQUIRE(h.Wait(q, 20) == 0);
  CHECK(Has(q.Out(), "ENV rank=0 local_rank=0 cvd=[5]"));
  CHECK(Has(q.Out(), "ENV rank=1 local_rank=0 cvd=[7]"));
  // A list too short for the workers: one line, exit 2, nothing started.
  Proc& r =
      h.StartDdprun("ddprun3", {"--standalone", "--nproc_per_node=3", "--virtual_local_rank", w},
                    {{"CUDA_VISIBLE_DEVICES", "5,7"}});
  CHECK(h.Wait(r, 20) == 2);
  CHECK(Has(r.Err(), "which has 2 for 3 workers"));
  CHECK_FALSE(Has(r.Out(), "ENV"));
}

TEST_CASE("torchrun 2.x row: --shutdown-timeout", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  const std::string pids = h.PidDir("pids");
  Proc& p =
      h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", "--shutdown-timeout=1", w},
                    {{"PIDDIR", pids}});
  h.WaitForPids(pids, 2, 10);
  SleepMs(200);  // the trap is set before the pid file is written
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(p, 15);
  const double took = SecondsSince(t0);
  INFO("stderr:\n" << p.Err() << "took " << took << " s");
  CHECK(rc == 143);
  CHECK(took >= 0.9);  // the workers ignore SIGTERM: SIGKILL after 1 s, not the default 30
  CHECK(took < 5.0);
  h.RequireAllGone(pids, 1);
}

TEST_CASE("torchrun 2.x row: --rdzv-conf use_libuv=0 and unknown keys", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p = h.StartDdprun("ddprun", {"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
                                     "--nnodes=1", "--rdzv_conf", "use_libuv=0,kubeflow_key=1", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "ENV rank=0"));
  CHECK(Has(p.Err(), "'use_libuv' is a torchrun setting that ddprun does not use; ignored"));
  CHECK(Has(p.Err(), "key 'kubeflow_key' is unknown to ddprun"));
}

TEST_CASE("torchrun 2.x row: --event-log-handler and TORCHELASTIC_SIGNALS_TO_HANDLE",
          "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p = h.StartDdprun("ddprun", {"--standalone", "--event-log-handler=null", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "signals=[SIGTERM,SIGINT,SIGHUP,SIGQUIT]"));
  Proc& q = h.StartDdprun("ddprun2", {"--standalone", "--signals-to-handle",
                                      "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", w});
  REQUIRE(h.Wait(q, 20) == 0);
  CHECK(Has(q.Out(), "signals=[SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1]"));
  Proc& r = h.StartDdprun("ddprun3", {"--standalone", "--logs-specs=custom", w});
  CHECK(h.Wait(r, 20) == 2);
  CHECK(Has(r.Err(), "--logs_specs=custom: torchrun's log layout plugins"));
}

TEST_CASE("torchrun 2.x row: the launcher's TORCHELASTIC_ERROR_FILE", "[multiproc]") {
  Harness h;
  // Rank 1 leaves a torchelastic @record file and exits 1; rank 0 succeeds.
  const std::string path = h.Script(
      "fail.sh",
      "#!/bin/sh\n"
      "if [ \"$RANK\" = 1 ]; then\n"
      "  printf '{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": "
      "{\"py_callstack\": \"tb\", \"timestamp\": \"1\"}}}' > \"$TORCHELASTIC_ERROR_FILE\"\n"
      "  exit 1\n"
      "fi\n"
      "exit 0\n");
  const std::string reply = h.dir() + "/launcher_error.json";
  Proc& p = h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", path},
                          {{"TORCHELASTIC_ERROR_FILE", reply}});
  CHECK(h.Wait(p, 20) == 1);
  INFO("stderr:\n" << p.Err());
  const std::string json = ReadFile(reply);
  CHECK(Has(json, "\"message\":\"ValueError: boom\""));
  CHECK(Has(json, "\"errorCode\":1"));
  CHECK(Has(json, "\"py_callstack\":\"tb\""));
  // A worker that wrote nothing: the report's description, its exit code.
  const std::string plain = h.Script("exit85.sh", "#!/bin/sh\necho dying >&2\nexit 85\n");
  const std::string reply2 = h.dir() + "/launcher_error2.json";
  Proc& q =
      h.StartDdprun("ddprun2", {"--standalone", plain}, {{"TORCHELASTIC_ERROR_FILE", reply2}});
  CHECK(h.Wait(q, 20) == 1);
  const std::string json2 = ReadFile(reply2);
  CHECK(Has(json2, "exited with exit code 85"));
  CHECK(Has(json2, "\"errorCode\":85"));
  CHECK(Has(json2, "\"py_callstack\":\"dying\""));
}

TEST_CASE("torchrun 2.x row: the same --node_rank on every node of a c10d job", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
  std::vector<Proc*> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(
        &h.StartDdprun("node" + std::to_string(i),
                       {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", endpoint,
                        "--rdzv_id=same0", "--node_rank=0", "--rdzv_conf=join_timeout=20", w}));
    if (i == 0) SleepMs(300);  // the first hosts the rendezvous
  }
  std::string out;
  for (Proc* n : nodes) {
    INFO(n->name << " stderr:\n" << n->Err());
    CHECK(h.Wait(*n, 30) == 0);
    out += n->Out();
  }
  CHECK(Has(out, "ENV rank=0 "));
  CHECK(Has(out, "ENV rank=1 "));
  CHECK(Has(nodes[1]->Err() + nodes[0]->Err(), "--node_rank=0 was not this node's to take"));
}

TEST_CASE("torchrun 2.x row: --duplicate-stdout-filters and --duplicate-stderr-filters",
          "[multiproc]") {
  Harness h;
  const std::string path = h.Script("lines.sh",
                                    "#!/bin/sh\necho \"loss=1 rank $RANK\"\necho \"noise $RANK\"\n"
                                    "echo \"a,b $RANK\"\necho \"warn $RANK\" >&2\n");
  const std::string logs = h.dir() + "/logs";
  Proc& p =
      h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", "--rdzv_id=filt", "--tee", "3",
                               "--event-log-handler=null", "--duplicate-stdout-filters=loss,a,,b",
                               "--duplicate-stderr-filters=warn", "--log-dir", logs, path});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  std::vector<std::string> runs = ListDir(logs);
  REQUIRE(runs.size() == 1);
  const std::string attempt = logs + "/" + runs[0] + "/attempt_0/";
  const std::string out = ReadFile(attempt + "filtered_stdout.log");
  INFO("filtered_stdout.log:\n" << out);
  // Prefixed as on the console, as torch 2.11's torchrun writes them.
  CHECK(Has(out, "[default0]:loss=1 rank 0\n"));
  CHECK(Has(out, "[default1]:loss=1 rank 1\n"));
  CHECK(Has(out, "[default1]:a,b 1\n"));  // ",," is a comma inside a filter
  CHECK_FALSE(Has(out, "noise"));
  CHECK(Has(ReadFile(attempt + "filtered_stderr.log"), "[default0]:warn 0\n"));
  CHECK(Lines(out).size() == 4);
}

TEST_CASE("torchrun 2.x row: --numa-binding on a node without a GPU", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  Proc& p =
      h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", "--numa-binding=node", w});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  if (Has(p.Err(), "--numa_binding=node: local rank")) {
    SUCCEED("this machine has an NVIDIA GPU: the binding line is printed");
  } else {
    CHECK(Has(p.Err(), "--numa_binding=node: no NVIDIA GPU on this node, so no worker is bound"));
  }
  CHECK(Has(p.Out(), "ENV rank=1"));
  Proc& q = h.StartDdprun("ddprun2", {"--standalone", "--numa-binding=sockets", w});
  CHECK(h.Wait(q, 20) == 2);
  CHECK(Has(q.Err(), "--numa_binding must be node, socket, exclusive or core-complex"));
}

TEST_CASE("torchrun 2.x row: ddprun started under the name torchrun; LOGLEVEL=DEBUG",
          "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  const std::string link = h.dir() + "/torchrun";
  REQUIRE(::symlink(Ddprun().c_str(), link.c_str()) == 0);
  Proc& p =
      h.Start("torchrun", {link, "--nproc-per-node=2", "--tee", "3", w}, {{"LOGLEVEL", "DEBUG"}});
  REQUIRE(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "[default1]:ENV rank=1 local_rank=1"));
  CHECK(Has(p.Err(), "[ddprun:agent "));  // LOGLEVEL=DEBUG: the agent's debug channel
}

TEST_CASE("torchrun 2.x row: --print-completion", "[multiproc]") {
  Harness h;
  const std::string link = h.dir() + "/torchrun";
  REQUIRE(::symlink(Ddprun().c_str(), link.c_str()) == 0);
  for (const std::string shell : {"bash", "zsh"}) {
    Proc& own = h.StartDdprun("completion_" + shell, {"completion", shell});
    Proc& flag = h.StartDdprun("print_" + shell, {"--print-completion", shell});
    Proc& torchrun = h.Start("torchrun_" + shell, {link, "--print_completion=" + shell});
    REQUIRE(h.Wait(own, 10) == 0);
    CHECK(h.Wait(flag, 10) == 0);
    CHECK(h.Wait(torchrun, 10) == 0);
    INFO(shell << " stderr: " << flag.Err());
    CHECK(Has(own.Out(), "--nproc_per_node"));
    CHECK(flag.Out() == own.Out());  // the same script, byte for byte
    CHECK(torchrun.Out() == own.Out());
    CHECK(flag.Err().empty());
  }
  // tcsh (torchrun's shtab has it): one line naming the shells ddprun completes.
  Proc& tcsh = h.StartDdprun("tcsh", {"--print-completion", "tcsh"});
  CHECK(h.Wait(tcsh, 10) == 2);
  CHECK(tcsh.Out().empty());
  CHECK(Lines(tcsh.Err()).size() == 1);
  CHECK(Has(tcsh.Err(), "--print-completion 'tcsh': ddprun completes bash and zsh"));
}

TEST_CASE("torchrun 2.x row: TORCHELASTIC_HEALTH_CHECK_PORT", "[multiproc]") {
  // torchrun's open-source health check server starts nothing; nor does
  // ddprun: the variable reaches the workers, nothing listens on the port,
  // and neither a port nor garbage changes the job.
  Harness h;
  const std::string probe = h.Script(
      "probe.sh",
      "#!/bin/bash\n"
      "port=$TORCHELASTIC_HEALTH_CHECK_PORT\n"
      "state=closed\n"
      "if [[ $port =~ ^[0-9]+$ ]] && (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then\n"
      "  state=open\n"
      "fi\n"
      "echo \"HEALTH rank=$RANK port=[$port] $state\"\n");
  const std::string port = std::to_string(FreePort());
  Proc& p = h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", probe},
                          {{"TORCHELASTIC_HEALTH_CHECK_PORT", port}});
  CHECK(h.Wait(p, 20) == 0);
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  CHECK(Has(p.Out(), "HEALTH rank=0 port=[" + port + "] closed"));
  CHECK(Has(p.Out(), "HEALTH rank=1 port=[" + port + "] closed"));
  CHECK_FALSE(Has(p.Err(), "HEALTH_CHECK"));
  Proc& q = h.StartDdprun("garbage", {"--standalone", probe},
                          {{"TORCHELASTIC_HEALTH_CHECK_PORT", "not-a-port"}});
  CHECK(h.Wait(q, 20) == 0);
  CHECK(Has(q.Out(), "HEALTH rank=0 port=[not-a-port] closed"));
}

namespace {

// Debian's torch (python3-torch 1.13) has torchelastic's FileTimerClient.
const std::string kTorchPython = "/usr/bin/python3";

bool TorchTimerAvailable() {
  return std::system((kTorchPython + " -c 'import torch.distributed.elastic.timer' >/dev/null 2>&1")
                         .c_str()) == 0;
}

}  // namespace

TEST_CASE("torchrun 2.x row: TORCHELASTIC_ENABLE_FILE_TIMER", "[multiproc]") {
  if (!TorchTimerAvailable()) {
    return SkipCase("multiproc", kTorchPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  const std::string script = h.dir() + "/timer_worker.py";
  {
    // Rank 1 overruns its 1 s timer; rank 0 finishes at once.
    std::ofstream f(script);
    f << "import os, time\n"
         "import torch.distributed.elastic.timer as timer\n"
         "path = os.environ['TORCHELASTIC_TIMER_FILE']\n"
         "print('TIMER_FILE', path, flush=True)\n"
         "timer.configure(timer.FileTimerClient(path))\n"
         "if os.environ['RANK'] == '1':\n"
         "    with timer.expires(after=1):\n"
         "        time.sleep(30)\n";
  }
  const std::string fifo = h.dir() + "/timer.fifo";
  const auto start = std::chrono::steady_clock::now();
  Proc& p =
      h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", "--max_restarts=0", script},
                    {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                     {"TORCHELASTIC_TIMER_FILE", fifo},
                     {"PYTHON_EXEC", kTorchPython}});
  CHECK(h.Wait(p, 25) == 1);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
  CHECK(took < 15);                           // the timer, not the 30 s sleep
  CHECK(Has(p.Out(), "TIMER_FILE " + fifo));  // the launcher's path, as torchrun
  CHECK(Has(p.Err(), "of worker rank 1 (pid "));
  CHECK(Has(p.Err(), "expired; sent SIGKILL"));
  CHECK(Has(p.Err(), "failed: worker rank 1"));  // the job's report
  CHECK(Has(p.Err(), "SIGKILL"));
  CHECK(::access(fifo.c_str(), F_OK) != 0);  // removed at exit

  // Garbage on the FIFO neither stops the agent nor fails the job; without
  // the launcher's path the agent picks a fresh one.
  const std::string garbage =
      h.Script("garbage.sh",
               "#!/bin/sh\n"
               "[ -p \"$TORCHELASTIC_TIMER_FILE\" ] || exit 7\n"
               "echo 'not json' > \"$TORCHELASTIC_TIMER_FILE\"\n"
               "head -c 10000 /dev/zero | tr '\\0' x > \"$TORCHELASTIC_TIMER_FILE\"\n"
               "sleep 0.5\n"
               "exit 0\n");
  Proc& q = h.StartDdprun("garbage", {"--standalone", "--nproc_per_node=2", garbage},
                          {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
  CHECK(h.Wait(q, 20) == 0);
  INFO("garbage stderr:\n" << q.Err());
  CHECK(Has(q.Err(), "not a timer request"));
}

TEST_CASE("torchrun 2.x row: --rdzv-conf is_host", "[multiproc]") {
  Harness h;
  const std::string w = WriteWorker(h);
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
  // The node told not to host starts first: without is_host it would host
  // the local endpoint itself; with is_host=false it waits for the other.
  Proc& guest = h.StartDdprun(
      "guest", {"--nnodes=2", "--rdzv_backend=c10d", endpoint, "--rdzv_id=hosting",
                "--rdzv_conf=is_host=false,join_timeout=20", "--local_addr=127.0.0.1", w});
  SleepMs(800);
  Proc& host = h.StartDdprun(
      "host", {"--nnodes=2", "--rdzv_backend=c10d", endpoint, "--rdzv_id=hosting",
               "--rdzv_conf=is_host=true,join_timeout=20", "--local_addr=127.0.0.2", w});
  CHECK(h.Wait(guest, 30) == 0);
  CHECK(h.Wait(host, 30) == 0);
  INFO("guest stderr:\n" << guest.Err() << "host stderr:\n" << host.Err());
  CHECK(Has(host.Err(), "hosting the rendezvous at 127.0.0.1:"));
  CHECK(Has(host.Err(), "(--rdzv_conf is_host=true)"));
  CHECK_FALSE(Has(guest.Err(), "hosting the rendezvous"));
  CHECK(Has(guest.Out() + host.Out(), "ENV rank=1 "));
}

namespace {

// A torch DDP worker (gloo, init_method env://) that prints what decides who
// hosts the TCPStore, whether this process listens on MASTER_PORT itself, and
// whether the job trained: every rank ends with rank 0's parameters.
const char* kStoreHostWorker = R"(import hashlib, os
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

def listens_here(port):
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"STORE rank={rank} use_agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']} "
      f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
      f"hosts={listens_here(int(os.environ['MASTER_PORT']))}", flush=True)
torch.manual_seed(1 + rank)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(7)
x = torch.randn(32 * world, 8, generator=gen)[rank::world]
y = x.sum(dim=1, keepdim=True)
for _ in range(3):
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
gathered = [None] * world
dist.all_gather_object(gathered, digest)
print(f"TRAINED rank={rank} identical={all(g == digest for g in gathered)}", flush=True)
dist.destroy_process_group()
)";

bool TorchDistributedAvailable() {
  return std::system((kTorchPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) ==
         0;
}

// The "STORE rank=R ..." line of rank R in `out` ("" if none).
std::string StoreLine(const std::string& out, int rank) {
  const std::string head = "STORE rank=" + std::to_string(rank) + " ";
  const std::size_t at = out.find(head);
  if (at == std::string::npos) return "";
  return out.substr(at, out.find('\n', at) - at);
}

// The "master=HOST:PORT" field of a STORE line.
std::string MasterOf(const std::string& line) {
  const std::size_t at = line.find("master=");
  if (at == std::string::npos) return "";
  return line.substr(at, line.find(' ', at) - at);
}

}  // namespace

TEST_CASE("torchrun 2.x row: TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "[multiproc]") {
  if (!TorchDistributedAvailable()) {
    return SkipCase("multiproc", kTorchPython + " cannot import torch; install python3-torch");
  }
  Harness h;
  const std::string script = h.Script("store_host.py", kStoreHostWorker);
  const EnvList disabled = {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"},
                            {"PYTHON_EXEC", kTorchPython}};

  SECTION("one node: worker rank 0 hosts the store, the job trains") {
    Proc& p = h.StartDdprun("ddprun", {"--standalone", "--nproc_per_node=2", script}, disabled);
    CHECK(h.Wait(p, 120) == 0);
    INFO("stdout:\n" << p.Out() << "stderr:\n" << p.Err());
    const std::string r0 = StoreLine(p.Out(), 0), r1 = StoreLine(p.Out(), 1);
    CHECK(Has(r0, "use_agent_store=False "));
    CHECK(Has(r0, "hosts=True"));
    CHECK(Has(r1, "use_agent_store=False "));
    CHECK(Has(r1, "hosts=False"));
    CHECK(MasterOf(r0) == MasterOf(r1));
    CHECK(Has(p.Out(), "TRAINED rank=0 identical=True"));
    CHECK(Has(p.Out(), "TRAINED rank=1 identical=True"));
    // Without the variable the agent hosts it, as before.
    Proc& q = h.StartDdprun("shared", {"--standalone", "--nproc_per_node=2", script},
                            {{"PYTHON_EXEC", kTorchPython}});
    CHECK(h.Wait(q, 120) == 0);
    INFO("shared stdout:\n" << q.Out());
    CHECK(Has(StoreLine(q.Out(), 0), "use_agent_store=True "));
    CHECK(Has(StoreLine(q.Out(), 0), "hosts=False"));
    CHECK(Has(q.Out(), "TRAINED rank=1 identical=True"));
  }

  SECTION("two agents: worker rank 0, on group rank 0's node, hosts it") {
    const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort());
    std::vector<Proc*> nodes;
    for (int i = 0; i < 2; ++i) {
      nodes.push_back(
          &h.StartDdprun("node" + std::to_string(i),
                         {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", endpoint,
                          "--rdzv_id=noshare", "--rdzv_conf=join_timeout=60", script},
                         disabled));
    }
    std::string out;
    for (Proc* n : nodes) {
      INFO(n->name << " stdout:\n" << n->Out() << "stderr:\n" << n->Err());
      CHECK(h.Wait(*n, 120) == 0);
      out += n->Out();
    }
    INFO("stdout of both:\n" << out);
    const std::string r0 = StoreLine(out, 0), r1 = StoreLine(out, 1);
    CHECK(Has(r0, "use_agent_store=False "));
    CHECK(Has(r0, "hosts=True"));
    CHECK(Has(r1, "use_agent_store=False "));
    CHECK(Has(r1, "hosts=False"));
    CHECK(MasterOf(r0) == MasterOf(r1));
    CHECK(Has(out, "TRAINED rank=0 identical=True"));
    CHECK(Has(out, "TRAINED rank=1 identical=True"));
  }
}
