#include "ddprun/agent/warm_standby.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/inplace_blocks.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "warm_bootstrap.h"  // kWarmBootstrap: warm_bootstrap.py, generated at configure time

namespace ddprun::agent {
namespace {

constexpr char kMagic[] = "ddprun-warm-1";
// After SIGKILL, how long Stop() waits for the kernel to reap the standby.
constexpr std::chrono::seconds kReapTimeout{5};
// The most room the standby's environment keeps for a rank's (one string
// under the kernel's MAX_ARG_STRLEN, 128 KiB).
constexpr std::size_t kMaxRoom = 120 * 1024;

// Variables the interpreter or the libraries it loads read once, at start
// or at import: a standby started with other values than the rank's would
// not be what a cold start of the rank is.
bool ReadAtStart(const std::string& name) {
  for (const char* prefix :
       {"PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "LC_", "MALLOC_"}) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return name == "LANG" || name == "TMPDIR" || name == "GLIBC_TUNABLES";
}

std::map<std::string, std::string> StartupEnv(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : env) {
    if (ReadAtStart(k)) out.emplace(k, v);
  }
  return out;
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// A descriptor for the worker's stdout or stderr, as a cold spawn would
// give it (boost_process_launcher.cc): the caller's pipe, else the log file
// opened for appending, else the agent's own.
absl::StatusOr<int> OutputFd(int given, const std::string& path, int own) {
  const int fd = given >= 0 ? ::fcntl(given, F_DUPFD_CLOEXEC, 3)
                 : !path.empty()
                     ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)
                     : ::fcntl(own, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open the worker's output",
                                               path.empty() ? "" : absl::StrCat(" '", path, "'"),
                                               ": ", std::strerror(errno)));
  }
  return fd;
}

void AddSection(std::string* out, const char* name, const std::vector<std::string>& items) {
  absl::StrAppend(out, name, std::string(1, '\0'), items.size(), std::string(1, '\0'));
  for (const std::string& s : items) absl::StrAppend(out, s, std::string(1, '\0'));
}

}  // namespace

WarmStandby::WarmStandby(ProcessLauncher& launcher, std::string modules, Logger log)
    : launcher_(launcher), modules_(std::move(modules)), log_(std::move(log)) {}

WarmStandby::~WarmStandby() { Stop(); }

bool WarmStandby::Supports(const std::vector<std::string>& argv) {
  if (argv.size() < 3 || argv[1] != "-u") return false;
  if (argv[2] == "-m") return argv.size() >= 4 && !argv[3].empty();
  return absl::EndsWith(argv[2], ".py") && !absl::StartsWith(argv[2], "-");
}

absl::Status WarmStandby::Start(const SpawnSpec& like, const std::set<int>& reserved) {
  if (Alive()) return absl::OkStatus();
  if (!Supports(like.argv)) return absl::FailedPreconditionError("not a Python entrypoint");
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  SpawnSpec spec;
  spec.argv = {like.argv[0],
               "-u",
               "-c",
               kWarmBootstrap,
               std::to_string(fds[1]),
               absl::StrJoin(reserved, ","),
               modules_};
  spec.env = like.env;
  // Not a rank's: no rank's metrics channel, stack file, checkpoint memory
  // or control block (the start-up hook stays off until it has a rank).
  spec.env.erase(kEnvMetricsFile);
  spec.env.erase(kEnvStackFile);
  RemoveCheckpointEnv(&spec.env);
  RemoveInplaceEnv(&spec.env);
  // No rank either: a tool that reads /proc/<pid>/environ must not take the
  // standby for local rank 0's worker.
  for (const char* name : {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK"}) spec.env.erase(name);
  // Room for the rank's environment in the area the kernel shows as
  // /proc/<pid>/environ (the bootstrap writes the rank's there): as large
  // again as the environment, within one string's limit (MAX_ARG_STRLEN).
  std::size_t bytes = 0;
  for (const auto& [k, v] : like.env) bytes += k.size() + v.size() + 2;
  spec.env[kEnvWarmRoom] = std::string(std::min<std::size_t>(bytes + 1024, kMaxRoom), '.');
  spec.stdout_path = "/dev/null";
  spec.stderr_path = "/dev/null";
  spec.inherit_fds = {fds[1]};
  auto child = launcher_.Spawn(spec);
  ::close(fds[1]);
  if (!child.ok()) {
    ::close(fds[0]);
    return child.status();
  }
  child_ = *std::move(child);
  sock_ = fds[0];
  line_.clear();
  ready_ = false;
  interpreter_ = {like.argv[0], like.argv[1]};
  startup_env_ = StartupEnv(spec.env);
  reserved_ = reserved;
  return absl::OkStatus();
}

bool WarmStandby::Alive() {
  if (!child_) return false;
  if (auto st = child_->Poll()) {
    ++failures_;
    log_(absl::StrCat("warm standby (pid ", child_->pid(), ") exited with ", st->Describe(),
                      " before a replacement needed it; the next one starts cold unless "
                      "another standby is ready"));
    child_.reset();
    CloseFd(sock_);
    return false;
  }
  return true;
}

bool WarmStandby::Ready() {
  if (ready_) return true;
  if (sock_ < 0) return false;
  char buf[512];
  while (true) {
    const ssize_t n = ::recv(sock_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;
    line_.append(buf, static_cast<std::size_t>(n));
  }
  const std::size_t nl = line_.find('\n');
  if (nl == std::string::npos || line_.empty() || line_[0] != 'R') return false;
  ready_ = true;
  // The default (torch) is skipped silently by interpreters without it; a
  // module named with --warm_modules is said once.
  if (nl > 1 && modules_ != kDefaultWarmModules) {
    log_(absl::StrCat("warm standby (pid ", pid(), "): could not import ", line_.substr(1, nl - 1),
                      "; replacements import it themselves (check --warm_modules)"));
  }
  return true;
}

pid_t WarmStandby::pid() const { return child_ ? child_->pid() : -1; }

std::string WarmStandby::Mismatch(const SpawnSpec& spec) const {
  if (!child_) return "no standby";
  if (spec.argv.size() < 2 || spec.argv[0] != interpreter_[0] || spec.argv[1] != interpreter_[1]) {
    return "another interpreter";
  }
  if (!Supports(spec.argv)) return "not a Python script or module";
  for (int fd : spec.inherit_fds) {
    if (reserved_.count(fd) == 0) return absl::StrCat("descriptor ", fd, " was not reserved");
  }
  const std::map<std::string, std::string> want = StartupEnv(spec.env);
  if (want != startup_env_) {
    for (const auto& [k, v] : want) {
      auto it = startup_env_.find(k);
      if (it == startup_env_.end() || it->second != v) return absl::StrCat(k, " differs");
    }
    for (const auto& [k, v] : startup_env_) {
      if (want.count(k) == 0) return absl::StrCat(k, " differs");
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<ChildProcess>> WarmStandby::Activate(const SpawnSpec& spec) {
  if (std::string why = Mismatch(spec); !why.empty()) {
    return absl::FailedPreconditionError(why);
  }
  std::vector<int> fds;
  auto close_all = [&fds] {
    for (int& fd : fds) CloseFd(fd);
  };
  absl::StatusOr<int> out = OutputFd(spec.stdout_fd, spec.stdout_path, STDOUT_FILENO);
  if (!out.ok()) return out.status();
  fds.push_back(*out);
  absl::StatusOr<int> err =
      spec.stderr_fd < 0 && !spec.stderr_path.empty() && spec.stderr_path == spec.stdout_path
          ? OutputFd(*out, "", STDERR_FILENO)
          : OutputFd(spec.stderr_fd, spec.stderr_path, STDERR_FILENO);
  if (!err.ok()) {
    close_all();
    return err.status();
  }
  fds.push_back(*err);
  std::vector<std::string> targets{"1", "2"};
  for (int fd : spec.inherit_fds) {
    fds.push_back(fd);  // sent as is; the agent keeps its own
    targets.push_back(std::to_string(fd));
  }
  std::vector<std::string> env;
  env.reserve(spec.env.size());
  for (const auto& [k, v] : spec.env) env.push_back(absl::StrCat(k, "=", v));
  std::vector<std::string> cpus;
  for (int c : spec.cpus) cpus.push_back(std::to_string(c));
  std::string body = absl::StrCat(kMagic, std::string(1, '\0'));
  AddSection(&body, "argv", spec.argv);
  AddSection(&body, "env", env);
  AddSection(&body, "cpus", cpus);
  AddSection(&body, "fds", targets);
  const std::uint32_t n = static_cast<std::uint32_t>(body.size());
  std::string msg{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                  static_cast<char>(n)};
  msg += body;

  // The descriptors ride on the first byte; the rest follows on the stream.
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  struct iovec iov;
  iov.iov_base = msg.data();
  iov.iov_len = msg.size();
  struct msghdr mh;
  std::memset(&mh, 0, sizeof(mh));
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control.data();
  mh.msg_controllen = control.size();
  struct cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  std::size_t sent = 0;
  absl::Status st;
  while (sent < msg.size()) {
    const ssize_t w = sent == 0 ? ::sendmsg(sock_, &mh, MSG_NOSIGNAL)
                                : ::send(sock_, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st = absl::UnavailableError(
          absl::StrCat("cannot hand the rank to the warm standby: ", std::strerror(errno)));
      break;
    }
    sent += static_cast<std::size_t>(w);
  }
  CloseFd(fds[0]);
  CloseFd(fds[1]);
  if (!st.ok()) {
    Stop();
    return st;
  }
  CloseFd(sock_);
  ready_ = false;
  return std::move(child_);
}

void WarmStandby::Stop() {
  CloseFd(sock_);
  if (!child_) return;
  child_->SignalGroup(SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + kReapTimeout;
  while (!child_->Poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a SIGKILLed child: ~1 ms
  }
  child_.reset();
  ready_ = false;
}

}  // namespace ddprun::agent
