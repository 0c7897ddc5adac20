// ddprun's start-up lines (a usage error, the "placed by" line) are each one
// write(2). Under mpirun or srun every ddprun of a node writes into the same
// stream, so a line written in two pieces can be split by another ddprun's
// line (seen under a real mpirun: tests/mpi/). Here ddprun's stderr is a
// SOCK_SEQPACKET socket, which keeps every write a message of its own.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

struct Written {
  int rc = -1;
  std::vector<std::string> writes;  // what each write(2) to stderr carried
};

// Runs ddprun with args and env (this process's, overlaid) and collects its
// stderr write by write; fails the test past 20 s.
Written RunDdprun(const std::vector<std::string>& args, const EnvList& env) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  std::vector<std::string> argv{Ddprun()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<std::string> env_strs;
  for (char** e = environ; *e != nullptr; ++e) env_strs.emplace_back(*e);
  for (const auto& [k, v] : env) env_strs.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strs) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 2);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(sv[1]);
  REQUIRE(spawned == 0);

  Written w;
  const auto t0 = Clock::now();
  for (;;) {
    pollfd p{sv[0], POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buf[65536];
      const ssize_t n = ::recv(sv[0], buf, sizeof(buf), 0);
      if (n <= 0) break;  // ddprun (and anything it started) closed its stderr
      w.writes.emplace_back(buf, static_cast<std::size_t>(n));
    }
    if (SecondsSince(t0) > 20) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  ::close(sv[0]);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (SecondsSince(t0) > 20) ::kill(pid, SIGKILL);
    SleepMs(5);
  }
  w.rc = DecodeStatus(status);
  return w;
}

std::string Describe(const std::vector<std::string>& writes) {
  std::string out;
  for (const std::string& w : writes) out += "write: [" + w + "]\n";
  return out;
}

}  // namespace

TEST_CASE("ddprun's usage error is one write, so ddprun processes sharing a stderr never tear it",
          "[multiproc]") {
  // What mpirun -np 2 on one host sets in each ddprun.
  const Written w = RunDdprun({"--rdzv_endpoint=127.0.0.1:1", FixtureWorker()},
                              {{"OMPI_COMM_WORLD_RANK", "0"},
                               {"OMPI_COMM_WORLD_SIZE", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  INFO(Describe(w.writes));
  CHECK(w.rc == 2);
  REQUIRE(w.writes.size() == 1);
  CHECK(w.writes[0] ==
        "ddprun: mpirun started 2 ddprun processes on this node (OMPI_COMM_WORLD_LOCAL_SIZE); "
        "ddprun starts the workers itself, so run one per node: mpirun --map-by ppr:1:node "
        "ddprun ...\n");
}

TEST_CASE("ddprun's 'placed by' line is one write", "[multiproc]") {
  const Written w = RunDdprun({"--rdzv_endpoint=127.0.0.1:1", "--print-config", FixtureWorker()},
                              {{"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  INFO(Describe(w.writes));
  CHECK(w.rc == 0);
  REQUIRE(w.writes.size() == 1);
  CHECK(w.writes[0] ==
        "ddprun: placed by mpi: node rank 1 (OMPI_COMM_WORLD_RANK=1), 2 nodes "
        "(OMPI_COMM_WORLD_SIZE=2); --scheduler=none turns this off\n");
}
