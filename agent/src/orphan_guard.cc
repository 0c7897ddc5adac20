#include "orphan_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ddprun::agent {
namespace {

// One message on the pipe: an op ('+' register, '-' unregister, 'q' quit)
// and a pid, fixed size so a read never splits one.
struct Message {
  char op;
  pid_t pgid;
};

// The guard's main loop. Async-signal-safe only: the table is preallocated.
[[noreturn]] void GuardMain(int fd, pid_t* table) {
  // Terminal signals reach the agent's whole process group; the guard must
  // survive them to do its job.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) {
    ::signal(s, SIG_IGN);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "ddprun-guard");
  // Close everything but the pipe and stderr: three close_range calls
  // instead of a close per descriptor (1,000 system calls at each start,
  // docs/launch.md); the loop where the kernel lacks close_range (< 5.9).
  const unsigned keep_lo = static_cast<unsigned>(std::min(fd, STDERR_FILENO));
  const unsigned keep_hi = static_cast<unsigned>(std::max(fd, STDERR_FILENO));
  const bool ranged = (keep_lo == 0 || ::close_range(0, keep_lo - 1, 0) == 0) &&
                      (keep_hi == keep_lo + 1 || ::close_range(keep_lo + 1, keep_hi - 1, 0) == 0) &&
                      ::close_range(keep_hi + 1, ~0U, 0) == 0;
  if (!ranged) {
    for (int i = 0; i < 1024; ++i) {
      if (i != fd && i != STDERR_FILENO) ::close(i);
    }
  }
  int n = 0;
  Message m;
  for (;;) {
    ssize_t r = ::read(fd, &m, sizeof(m));
    if (r < 0 && errno == EINTR) continue;
    if (r != static_cast<ssize_t>(sizeof(m))) break;  // EOF: the agent is gone
    if (m.op == 'q') ::_exit(0);
    if (m.op == '+' && n < OrphanGuard::kMaxGroups) {
      table[n++] = m.pgid;
    } else if (m.op == '-') {
      for (int i = 0; i < n; ++i) {
        if (table[i] == m.pgid) {
          table[i] = table[--n];
          break;
        }
      }
    }
  }
  for (int i = 0; i < n; ++i) ::kill(-table[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OrphanGuard>> OrphanGuard::Start() {
  // A socket rather than a pipe: send(MSG_NOSIGNAL) cannot raise SIGPIPE in
  // the agent if the guard is gone.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::ResourceExhaustedError(std::string("cannot create the orphan guard's pipe: ") +
                                        std::strerror(errno));
  }
  // Allocated before fork: the guard must not call malloc.
  static std::vector<pid_t> table(kMaxGroups);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::ResourceExhaustedError(std::string("cannot fork the orphan guard: ") +
                                        std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[1]);
    GuardMain(fds[0], table.data());
  }
  ::close(fds[0]);
  return std::unique_ptr<OrphanGuard>(new OrphanGuard(pid, fds[1]));
}

OrphanGuard::~OrphanGuard() {
  Send('q', 0);
  // It exits at once on 'q': its end of the socket closes as it does, which
  // wakes this poll (instead of a first 1 ms sleep on every exit).
  pollfd p{fd_, POLLIN, 0};
  while (::poll(&p, 1, 200) < 0 && errno == EINTR) {
  }
  ::close(fd_);
  // Reap it. Bounded (200 ms): never hang on it.
  for (int i = 0; i < 2000; ++i) {
    pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) return;
    ::usleep(100);
  }
}

void OrphanGuard::Register(pid_t pgid) { Send('+', pgid); }
void OrphanGuard::Unregister(pid_t pgid) { Send('-', pgid); }

void OrphanGuard::Send(char op, pid_t pgid) {
  Message m{op, pgid};
  std::lock_guard<std::mutex> lock(mu_);
  ssize_t r;
  do {
    r = ::send(fd_, &m, sizeof(m), MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
}

}  // namespace ddprun::agent
