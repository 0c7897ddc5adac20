// End to end with real PyTorch (Debian's python3-torch 1.13, CPU, Gloo): an
// unmodified DDP script (examples/ddp_train.py, init_process_group("gloo"),
// env://) trains under ddprun on one node and on two nodes, and its
// parameters end identical on every rank.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/skip.h"

extern char** environ;

using ddprun::test::SkipCase;

namespace {

using namespace std::chrono_literals;

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here (this-machine.md)

bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/ddprun_e2e_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process with its output in a file; killed (group) if still alive at destruction.
struct Proc {
  pid_t pid = -1;
  std::string log;
  ~Proc() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

void Start(Proc& p, const std::vector<std::string>& argv, const std::string& log,
           const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  p.log = log;
  REQUIRE(posix_spawn(&p.pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data()) == 0);
  posix_spawn_file_actions_destroy(&fa);
}

// Waits for the process with a deadline; returns its exit code (or -signal).
int Wait(Proc& p, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid) {
      p.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    std::this_thread::sleep_for(10ms);
  }
  FAIL("process did not finish in time; its output:\n" << ReadFile(p.log));
  return -1;
}

int FreePort() {
  // The OS picks a port that is free now; fine for a test that binds it at once.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// Every rank wrote "<digest> <world> <first_loss> <last_loss>": one digest, losses fell.
void CheckRanks(const std::string& dir, int world) {
  std::set<std::string> digests;
  for (int r = 0; r < world; ++r) {
    std::istringstream in(ReadFile(dir + "/rank" + std::to_string(r) + ".txt"));
    std::string digest;
    int w = 0;
    double first = 0, last = 0;
    in >> digest >> w >> first >> last;
    INFO("rank " << r);
    REQUIRE(digest.size() == 64);
    CHECK(w == world);
    CHECK(last < first);
    digests.insert(digest);
  }
  CHECK(digests.size() == 1);
}

const std::string kBin = DDPRUN_BIN_DIR;
const std::string kScript = std::string(DDPRUN_SOURCE_DIR) + "/examples/ddp_train.py";

}  // namespace

TEST_CASE("PyTorch DDP (gloo, env://) on one node under ddprun", "[e2e]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  const std::string dir = MakeTempDir();
  Proc p;
  Start(p, {kBin + "/ddprun", "--nproc_per_node=2", kScript, "--steps", "4", "--out", dir},
        dir + "/ddprun.log", {"PYTHON_EXEC=" + kPython});
  int rc = Wait(p, 180s);
  INFO(ReadFile(dir + "/ddprun.log"));
  REQUIRE(rc == 0);
  CheckRanks(dir, 2);
}

// Issue 33 item 16: the README's quick tour runs as written: its PyTorch
// line (the one that passes --epochs through) is read from README.md, with
// build/bin/ and examples/ taken from this build and source tree.
TEST_CASE("the README's quick-tour PyTorch command runs examples/train.py as written", "[e2e]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  std::string line;
  {
    std::istringstream readme(ReadFile(std::string(DDPRUN_SOURCE_DIR) + "/README.md"));
    for (std::string l; std::getline(readme, l);) {
      if (l.find("build/bin/ddprun") != std::string::npos &&
          l.find("--epochs") != std::string::npos) {
        line = l;
        break;
      }
    }
  }
  INFO("README line: " << line);
  REQUIRE_FALSE(line.empty());
  std::vector<std::string> argv, env;
  std::istringstream words(line.substr(0, line.find('#')));
  for (std::string w; words >> w;) {
    if (argv.empty() && w.find('=') != std::string::npos) {
      env.push_back(w);  // VAR=value before the command
    } else if (w == "build/bin/ddprun") {
      argv.push_back(kBin + "/ddprun");
    } else if (w.rfind("examples/", 0) == 0) {
      argv.push_back(std::string(DDPRUN_SOURCE_DIR) + "/" + w);
    } else {
      argv.push_back(w);
    }
  }
  const std::string dir = MakeTempDir();
  Proc p;
  Start(p, argv, dir + "/ddprun.log", env);
  const int rc = Wait(p, 300s);
  const std::string log = ReadFile(dir + "/ddprun.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("epoch 3/3: mean loss") != std::string::npos);
  CHECK(log.find("done: 3 epoch(s) on 4 rank(s), replicas identical") != std::string::npos);
}

TEST_CASE("PyTorch DDP, torchrun's static command line: --master_addr/--master_port, tcp://",
          "[e2e]") {
  if (!TorchAvailable()) {
    WARN("SKIPPED: " << kPython << " cannot import torch; install python3-torch");
    return;
  }
  // As under torchrun: no --rdzv_backend, so naming the master selects the
  // static backend; node rank 0 hosts the store on --master_port and
  // init_process_group(init_method="tcp://MASTER_ADDR:MASTER_PORT") reaches it.
  const std::string dir = MakeTempDir();
  const int port = FreePort();
  Proc p;
  Start(p,
        {kBin + "/ddprun", "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
         "--nproc_per_node=2", kScript, "--steps", "4", "--out", dir, "--init", "tcp"},
        dir + "/ddprun.log", {"PYTHON_EXEC=" + kPython});
  int rc = Wait(p, 180s);
  INFO(ReadFile(dir + "/ddprun.log"));
  REQUIRE(rc == 0);
  CheckRanks(dir, 2);
}

TEST_CASE(
    "torchrun's static command line: a script whose tcp:// URL is the --master_port it was "
    "given",
    "[e2e]") {
  if (!TorchAvailable()) {
    WARN("SKIPPED: " << kPython << " cannot import torch; install python3-torch");
    return;
  }
  // The script names the store by the port on the command line, not by
  // MASTER_PORT: under torchrun that store exists (node rank 0 hosts it).
  // Before issue 9 ddprun ignored --master_port, and the workers waited as
  // clients (TORCHELASTIC_USE_AGENT_STORE) for torch's 30-minute timeout.
  const std::string dir = MakeTempDir();
  const std::string script = dir + "/tcp_allreduce.py";
  std::ofstream(script) << R"(import faulthandler, os, sys
import torch, torch.distributed as dist
faulthandler.dump_traceback_later(60, exit=True)
port = sys.argv[1]
assert os.environ["MASTER_PORT"] == port, os.environ["MASTER_PORT"]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(sys.argv[2], f"rank{dist.get_rank()}.sum"), "w") as f:
    f.write(f"{t.item():g}\n")
dist.barrier()
dist.destroy_process_group()
)";
  const int port = FreePort();
  Proc p;
  Start(p,
        {kBin + "/ddprun", "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
         "--nproc_per_node=2", script, std::to_string(port), dir},
        dir + "/ddprun.log", {"PYTHON_EXEC=" + kPython});
  int rc = Wait(p, 120s);
  INFO(ReadFile(dir + "/ddprun.log"));
  REQUIRE(rc == 0);
  CHECK(ReadFile(dir + "/rank0.sum") == "3\n");
  CHECK(ReadFile(dir + "/rank1.sum") == "3\n");
}

TEST_CASE("PyTorch DDP on two nodes: ddprund and two ddprun agents on loopback", "[e2e]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  const std::string dir = MakeTempDir();
  const int port = FreePort();
  Proc daemon;
  Start(daemon,
        {kBin + "/ddprund", "--host", "127.0.0.1", "--port", std::to_string(port),
         "--dashboard_port", "0"},
        dir + "/ddprund.log", {});
  Proc a, b;
  auto agent = [&](Proc& p, const std::string& addr, const std::string& log) {
    Start(p,
          {kBin + "/ddprun", "--nnodes=2", "--nproc_per_node=2",
           "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=e2e-two-nodes",
           "--local_addr=" + addr, kScript, "--steps", "4", "--out", dir},
          log, {"PYTHON_EXEC=" + kPython});
  };
  agent(a, "127.0.0.1", dir + "/a.log");
  agent(b, "127.0.0.2", dir + "/b.log");
  int ra = Wait(a, 180s);
  int rb = Wait(b, 180s);
  INFO("node a:\n" << ReadFile(dir + "/a.log") << "node b:\n" << ReadFile(dir + "/b.log"));
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
  CheckRanks(dir, 4);
  // Ranks are contiguous per node: node a (group rank 0, 127.0.0.1) ran ranks 0-1.
  CHECK_THAT(ReadFile(dir + "/a.log"), Catch::Contains("ranks 0-1 of 4"));
  CHECK_THAT(ReadFile(dir + "/b.log"), Catch::Contains("ranks 2-3 of 4"));
  ::kill(daemon.pid, SIGTERM);
  CHECK(Wait(daemon, 10s) == 0);
}

// Issue 33 item 9b: nodes with different --nproc_per_node (2 and 1), as
// torchrun runs them: one DDP job of world size 3, ranks 0-1 on node a and
// rank 2 on node b, the parameters identical on every rank.
TEST_CASE("PyTorch DDP on two nodes with different --nproc_per_node (2 and 1)", "[e2e]") {
  if (!TorchAvailable()) {
    return SkipCase("e2e", kPython + " cannot import torch; install python3-torch");
  }
  const std::string dir = MakeTempDir();
  const int port = FreePort();
  Proc daemon;
  Start(daemon,
        {kBin + "/ddprund", "--host", "127.0.0.1", "--port", std::to_string(port),
         "--dashboard_port", "0"},
        dir + "/ddprund.log", {});
  Proc a, b;
  auto agent = [&](Proc& p, const std::string& addr, int nproc, const std::string& log) {
    Start(p,
          {kBin + "/ddprun", "--nnodes=2", "--nproc_per_node=" + std::to_string(nproc),
           "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=e2e-mixed",
           "--local_addr=" + addr, kScript, "--steps", "4", "--out", dir},
          log, {"PYTHON_EXEC=" + kPython});
  };
  agent(a, "127.0.0.1", 2, dir + "/a.log");
  agent(b, "127.0.0.2", 1, dir + "/b.log");
  int ra = Wait(a, 180s);
  int rb = Wait(b, 180s);
  INFO("node a:\n" << ReadFile(dir + "/a.log") << "node b:\n" << ReadFile(dir + "/b.log"));
  REQUIRE(ra == 0);
  REQUIRE(rb == 0);
  CheckRanks(dir, 3);
  CHECK_THAT(ReadFile(dir + "/a.log"), Catch::Contains("ranks 0-1 of 3"));
  CHECK_THAT(ReadFile(dir + "/b.log"), Catch::Contains("ranks 2-2 of 3"));
  ::kill(daemon.pid, SIGTERM);
  CHECK(Wait(daemon, 10s) == 0);
}
