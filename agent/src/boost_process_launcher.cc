// The real ProcessLauncher, over Boost.Process v1.
//
// Boost forks, runs our exec-setup hook in the child, and execs; an exec
// failure travels back over Boost's CLOEXEC error pipe, so Spawn() learns of
// it synchronously. After the spawn the bp::child is detached and this file
// owns the pid: Poll() is waitpid(WNOHANG), SignalGroup() is killpg().
//
// Everything the child runs between fork and exec must be async-signal-safe
// (the agent has gRPC threads): the hook uses only syscalls on data prepared
// in the parent.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

// glibc hides vfork's feature macro under POSIX 2008, so Boost.Process would
// fall back to fork(); vfork itself is available and is what we want.
#ifndef BOOST_POSIX_HAS_VFORK
#define BOOST_POSIX_HAS_VFORK 1
#endif
#include <boost/process.hpp>
#include <boost/process/extend.hpp>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "orphan_guard.h"

namespace ddprun::agent {
namespace {

namespace bp = boost::process;

// Resolves argv[0] like execvp: a name without '/' is looked up in the PATH
// of the child's environment (the agent's PATH when the child has none).
// The signals whose disposition is not SIG_DFL now (ignored or caught; bit
// s-1 for signal s), from the SigIgn and SigCgt lines of /proc/self/status:
// one read (~10 us) instead of the vfork child resetting all 64 signals
// (~60 us per spawn, the launcher suspended meanwhile). Every bit set when
// the file cannot be read or parsed, so the child then resets them all.
std::uint64_t NonDefaultSignals() {
  constexpr std::uint64_t kAll = ~std::uint64_t{0};
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kAll;
  char buf[8192];
  std::size_t len = 0;
  ssize_t n;
  while (len < sizeof buf - 1 && (n = ::read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += n;
  ::close(fd);
  buf[len] = '\0';
  std::uint64_t mask = 0;
  int found = 0;
  for (const char* key : {"\nSigIgn:\t", "\nSigCgt:\t"}) {
    const char* at = ::strstr(buf, key);
    if (at == nullptr) return kAll;
    char* end = nullptr;
    mask |= std::strtoull(at + ::strlen(key), &end, 16);
    if (end == at + ::strlen(key)) return kAll;
    ++found;
  }
  return found == 2 ? mask : kAll;
}

// The PATH that argv[0] is looked up in: the child's, else the agent's.
std::string SearchPath(const SpawnSpec& spec) {
  auto it = spec.env.find("PATH");
  std::string search = it != spec.env.end() ? it->second : "";
  if (search.empty()) {
    const char* own = std::getenv("PATH");
    search = own ? own : "/usr/local/bin:/usr/bin:/bin";
  }
  return search;
}

absl::StatusOr<std::string> ResolveExecutable(const SpawnSpec& spec, const std::string& search) {
  const std::string& name = spec.argv[0];
  std::string path;
  if (name.find('/') != std::string::npos) {
    path = name;
  } else {
    // execvp's search (bp::search_path would need the compiled
    // Boost.Filesystem): the first regular executable file on PATH.
    std::size_t start = 0;
    while (path.empty() && start <= search.size()) {
      std::size_t end = search.find(':', start);
      if (end == std::string::npos) end = search.size();
      std::string dir = search.substr(start, end - start);
      std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        path = candidate;
      }
      start = end + 1;
    }
    if (path.empty()) {
      return absl::NotFoundError(absl::StrCat("cannot start worker: '", name,
                                              "' was not found in PATH; check the command or "
                                              "give its full path"));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot start worker: '", path,
                                            "' does not exist; check the command"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot start worker: '", path, "' is a directory; give the program to run"));
  }
  if (::access(path.c_str(), X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot start worker: '", path,
                                                    "' is not executable; chmod +x it or run "
                                                    "it through its interpreter"));
  }
  return path;
}

// Opens an output file for a child's stdout or stderr (append, so restarts
// keep the earlier attempts' output).
absl::StatusOr<int> OpenOutput(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open worker log '", path,
                                                    "': ", std::strerror(errno),
                                                    "; check --log_dir"));
  }
  return fd;
}

class BoostChild final : public ChildProcess {
 public:
  BoostChild(pid_t pid, OrphanGuard* guard) : pid_(pid), guard_(guard) {
    if (guard_) guard_->Register(pid_);
  }
  ~BoostChild() override = default;  // never kills: the agent decides

  pid_t pid() const override { return pid_; }

  std::optional<ExitStatus> Poll() override {
    if (status_) return status_;
    int st = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return std::nullopt;
    ExitStatus es;
    if (r < 0) {
      // ECHILD: somebody else reaped it; its status is lost.
      es.exit_code = -1;
    } else if (WIFEXITED(st)) {
      es.exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      es.signal = WTERMSIG(st);
    } else {
      return std::nullopt;  // stopped/continued: still alive
    }
    status_ = es;
    // The worker is reaped; grandchildren it left in its group are still
    // signalled by the agent's stop path, not by the guard (the pgid may be
    // reused once the group is empty).
    if (guard_) guard_->Unregister(pid_);
    return status_;
  }

  void SignalGroup(int sig) override {
    if (status_) return;
    if (::killpg(pid_, sig) != 0 && errno == ESRCH) {
      // The group is not formed yet (the child has not run setpgid) or is
      // gone: signal the child itself.
      ::kill(pid_, sig);
    }
  }

 private:
  const pid_t pid_;
  OrphanGuard* const guard_;  // owned by the launcher, which outlives its children
  std::optional<ExitStatus> status_;
};

class BoostProcessLauncher final : public ProcessLauncher {
 public:
  // Without a guard (fork failed) workers are still covered by PDEATHSIG;
  // only grandchildren could then outlive a SIGKILLed agent.
  explicit BoostProcessLauncher(std::unique_ptr<OrphanGuard> guard) : guard_(std::move(guard)) {}

  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) override {
    if (spec.argv.empty() || spec.argv[0].empty()) {
      return absl::InvalidArgumentError(
          "cannot start worker: the command is empty; give the program to run after the flags");
    }
    DDPRUN_ASSIGN_OR_RETURN(const std::string exe, Resolve(spec));

    // Everything the child needs, prepared before fork.
    std::vector<std::string> env_strings;
    env_strings.reserve(spec.env.size());
    for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    envp.reserve(env_strings.size() + 1);
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    int out_fd = -1;
    int err_fd = -1;
    auto close_fds = [&] {
      if (out_fd >= 0) ::close(out_fd);
      if (err_fd >= 0) ::close(err_fd);
    };
    if (!spec.stdout_path.empty()) {
      DDPRUN_ASSIGN_OR_RETURN(out_fd, OpenOutput(spec.stdout_path));
    }
    if (!spec.stderr_path.empty()) {
      absl::StatusOr<int> fd = spec.stderr_path == spec.stdout_path && out_fd >= 0
                                   ? absl::StatusOr<int>(::fcntl(out_fd, F_DUPFD_CLOEXEC, 3))
                                   : OpenOutput(spec.stderr_path);
      if (!fd.ok() || *fd < 0) {
        close_fds();
        return fd.ok() ? absl::InternalError("cannot duplicate the worker log descriptor")
                       : fd.status();
      }
      err_fd = *fd;
    }

    const pid_t parent = ::getpid();
    // A descriptor given by the caller (a log pipe) wins over a path.
    const int child_out = spec.stdout_fd >= 0 ? spec.stdout_fd : out_fd;
    const int child_err = spec.stderr_fd >= 0 ? spec.stderr_fd : err_fd;
    // Built here: the child may only make async-signal-safe calls.
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (int c : spec.cpus) {
      if (c < 0 || c >= CPU_SETSIZE) {
        close_fds();
        return absl::InvalidArgumentError(absl::StrCat("CPU ", c, " is out of range"));
      }
      CPU_SET(c, &cpus);
    }
    const bool bind = !spec.cpus.empty();
    // Dispositions at this spawn; a handler installed by another thread
    // between here and exec is reset by exec itself (only SIG_IGN survives it).
    const std::uint64_t non_default = NonDefaultSignals();
    const std::vector<int> inherit = spec.inherit_fds;  // copied before fork
    auto exec_setup = [parent, child_out, child_err, bind, cpus, non_default,
                       &inherit](auto& exec) {
      // Runs in the child, between fork and exec: async-signal-safe only.
      sigset_t empty;
      sigemptyset(&empty);
      struct sigaction dfl;
      ::memset(&dfl, 0, sizeof(dfl));
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s = 1; s < NSIG && s <= 64; ++s) {
        if (s == SIGKILL || s == SIGSTOP || !(non_default >> (s - 1) & 1)) continue;
        ::sigaction(s, &dfl, nullptr);  // fails harmlessly for reserved signals
      }
      ::sigprocmask(SIG_SETMASK, &empty, nullptr);
      if (::setpgid(0, 0) != 0) {
        exec.set_error(std::error_code(errno, std::system_category()), "setpgid failed");
        ::_exit(127);
      }
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        exec.set_error(std::error_code(errno, std::system_category()),
                       "prctl(PR_SET_PDEATHSIG) failed");
        ::_exit(127);
      }
      // The agent died before the death signal was armed: do not outlive it.
      if (::getppid() != parent) ::_exit(127);
      if (bind && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
        exec.set_error(std::error_code(errno, std::system_category()),
                       "sched_setaffinity (--cpu_bind) failed");
        ::_exit(127);
      }
      if (child_out >= 0 && ::dup2(child_out, STDOUT_FILENO) < 0) ::_exit(127);
      if (child_err >= 0 && ::dup2(child_err, STDERR_FILENO) < 0) ::_exit(127);
      // Do not leak the agent's descriptors (sockets of its servers) into the
      // worker: mark them close-on-exec; Boost's error pipe must stay open
      // until exec, so no plain close_range.
#ifdef SYS_close_range
      ::syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
      // ... but for the descriptors the worker inherits (SpawnSpec::inherit_fds;
      // fcntl is async-signal-safe, the vector is only read).
      for (int fd : inherit) {
        if (::fcntl(fd, F_SETFD, 0) != 0) ::_exit(127);
      }
    };
    auto env_setup = [&envp](auto& exec) { exec.env = envp.data(); };

    std::error_code ec;
    bp::child child;
    try {
      std::vector<std::string> args(spec.argv.begin() + 1, spec.argv.end());
      child = bp::child(bp::exe = exe, bp::args = args, bp::extend::on_setup = env_setup,
                        bp::extend::on_exec_setup = exec_setup,
                        // vfork: the agent's page tables are not copied, so a
                        // spawn costs ~0.3 ms instead of ~15 ms. exec_setup
                        // only makes async-signal-safe calls.
                        bp::posix::use_vfork, ec);
    } catch (const std::exception& e) {
      close_fds();
      return absl::InternalError(absl::StrCat("cannot start worker '", exe, "': ", e.what()));
    }
    close_fds();
    if (ec || !child.valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot start worker '", exe, "': ", ec ? ec.message() : "unknown error",
          "; check that it is a runnable program"));
    }
    const pid_t pid = child.id();
    // Also form the group from the parent side, so that a signal sent right
    // after Spawn() reaches the group (EACCES once the child exec'd: fine).
    ::setpgid(pid, pid);
    child.detach();
    return std::unique_ptr<ChildProcess>(std::make_unique<BoostChild>(pid, guard_.get()));
  }

  void RemoveOnDeath(const std::string& dir) override {
    if (guard_) guard_->RemoveOnDeath(dir);
  }

  void Close() override {
    if (guard_) guard_->Dismiss();
  }

 private:
  // argv[0] resolved as execvp would, checked once per command and PATH: a
  // round's workers share them (8 workers walked PATH 8 times, ~150 stat
  // calls). A program removed or changed afterwards fails at exec instead,
  // with the exec's own error.
  absl::StatusOr<std::string> Resolve(const SpawnSpec& spec) {
    const std::string search = SearchPath(spec);
    std::string key = search + '\0' + spec.argv[0];
    std::lock_guard<std::mutex> lock(resolved_mu_);
    if (key == resolved_key_) return resolved_path_;
    DDPRUN_ASSIGN_OR_RETURN(std::string path, ResolveExecutable(spec, search));
    resolved_key_ = std::move(key);
    resolved_path_ = path;
    return path;
  }

  std::unique_ptr<OrphanGuard> guard_;
  std::mutex resolved_mu_;
  std::string resolved_key_;   // under resolved_mu_: PATH, NUL, argv[0] of the last success
  std::string resolved_path_;  // under resolved_mu_
};

}  // namespace

std::string ExitStatus::Describe() const {
  if (signal != 0) {
    // glibc's abbreviation ("SEGV"); none for the real-time signals.
    if (const char* abbrev = ::sigabbrev_np(signal)) {
      return absl::StrCat("signal SIG", abbrev, " (", signal, ")");
    }
    if (signal >= SIGRTMIN && signal <= SIGRTMAX) {
      return absl::StrCat("signal SIGRTMIN+", signal - SIGRTMIN, " (", signal, ")");
    }
    return absl::StrCat("signal ", signal);
  }
  if (exit_code < 0) return "an unknown status (reaped elsewhere)";
  return absl::StrCat("exit code ", exit_code);
}

std::unique_ptr<ProcessLauncher> MakeBoostProcessLauncher() {
  auto guard = OrphanGuard::Start();
  if (!guard.ok()) {
    std::fprintf(stderr, "ddprun: warning: %s; grandchildren of workers may outlive a killed ddprun\n",
                 std::string(guard.status().message()).c_str());
    return std::make_unique<BoostProcessLauncher>(nullptr);
  }
  return std::make_unique<BoostProcessLauncher>(std::move(*guard));
}

}  // namespace ddprun::agent
