// CaptureStack (stack_capture.h).
#include "ddprun/agent/stack_capture.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kMaxStackBytes = 256 * 1024;
// faulthandler writes the whole dump from its signal handler; once the file
// stops growing for this long, the dump is complete.
constexpr auto kQuietAfterDump = milliseconds(100);
constexpr auto kPythonBudget = milliseconds(3000);

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > 4096) s.resize(4096);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// The process group of `pid`, or -1.
pid_t PgidOf(pid_t pid) {
  const pid_t g = ::getpgid(pid);
  return g < 0 ? -1 : g;
}

off_t FileSize(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_size : -1;
}

// The Python stacks through faulthandler, or an error.
std::optional<std::string> PythonStack(const StackTarget& t, Clock::time_point deadline,
                                       std::string* why) {
  if (!t.channel || t.channel->stack_signal <= 0 || t.stack_fd < 0) {
    *why = "no Python start-up hook in this worker";
    return std::nullopt;
  }
  // The hook's process: the worker or one of its group (a wrapper script's
  // Python child). Never signal anything else.
  const pid_t target = static_cast<pid_t>(t.channel->owner_pid);
  if (target <= 0 || (target != t.pid && PgidOf(target) != t.pid)) {
    *why = "the channel's owner is not in the worker's process group";
    return std::nullopt;
  }
  const off_t before = FileSize(t.stack_fd);
  if (before < 0) {
    *why = "the stack file cannot be read";
    return std::nullopt;
  }
  if (::kill(target, t.channel->stack_signal) != 0) {
    *why = absl::StrCat("cannot signal pid ", target, ": ", std::strerror(errno));
    return std::nullopt;
  }
  off_t size = before;
  Clock::time_point grew_at{};
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
    const off_t now = FileSize(t.stack_fd);
    if (now != size) {
      size = now;
      grew_at = Clock::now();
    } else if (size > before && Clock::now() - grew_at >= kQuietAfterDump) {
      break;
    }
  }
  if (size <= before) {
    *why = "faulthandler wrote nothing (the interpreter may be gone)";
    return std::nullopt;
  }
  const std::size_t n =
      std::min<std::size_t>(static_cast<std::size_t>(size - before), kMaxStackBytes);
  std::string text(n, '\0');
  const ssize_t r = ::pread(t.stack_fd, text.data(), n, before);
  text.resize(r > 0 ? static_cast<std::size_t>(r) : 0);
  return PythonStackInnermostLast(text);
}

std::string FindOnPath(const char* name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// `gdb -p PID -batch`, killed at the deadline. Native frames, or an error.
std::optional<std::string> NativeStack(pid_t pid, Clock::time_point deadline, std::string* why) {
  const std::string gdb = FindOnPath("gdb");
  if (gdb.empty()) {
    *why = "gdb is not installed";
    return std::nullopt;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    *why = absl::StrCat("pipe: ", std::strerror(errno));
    return std::nullopt;
  }
  const std::string pid_s = std::to_string(pid);
  std::vector<std::string> args = {
      gdb, "-nx", "-batch", "-p", pid_s, "-ex", "set pagination off", "-ex", "thread apply all bt"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the agent blocks its signals
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t child = -1;
  const int rc = ::posix_spawn(&child, gdb.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    *why = absl::StrCat("cannot run gdb: ", std::strerror(rc));
    return std::nullopt;
  }
  std::string out;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd p {
      fds[0], POLLIN, 0
    };
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 200)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r <= 0) break;  // gdb closed its output: done
    if (out.size() < kMaxStackBytes) out.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(child, SIGKILL);  // gdb detaches from the worker as it dies
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    *why = "gdb did not finish in time";
    return std::nullopt;
  }
  // Only the thread sections; gdb's chatter (symbol loading) is dropped.
  std::string frames;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "Thread ") || absl::StartsWith(line, "#")) {
      absl::StrAppend(&frames, line, "\n");
    }
  }
  if (frames.empty()) {
    std::string last = out.size() > 300 ? out.substr(out.size() - 300) : out;
    *why = absl::StrCat("gdb could not read the process: ", last);
    return std::nullopt;
  }
  return frames;
}

std::string KernelStack(pid_t pid) {
  std::string text;
  const std::string base = absl::StrCat("/proc/", pid, "/task");
  // Each thread: where it sleeps in the kernel and the system call it is in.
  std::vector<std::string> tids;
  if (DIR* d = ::opendir(base.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(tids.begin(), tids.end(),
            [](const std::string& a, const std::string& b) { return std::stol(a) < std::stol(b); });
  if (tids.size() > 64) tids.resize(64);
  for (const std::string& tid : tids) {
    const std::string dir = absl::StrCat(base, "/", tid);
    absl::StrAppend(&text, "thread ", tid, " (", ReadSmallFile(dir + "/comm"), "): wchan ",
                    ReadSmallFile(dir + "/wchan"), ", syscall ", ReadSmallFile(dir + "/syscall"),
                    "\n");
    const std::string stack = ReadSmallFile(dir + "/stack");  // root only
    if (!stack.empty()) absl::StrAppend(&text, stack, "\n");
  }
  return text;
}

}  // namespace

std::string PythonStackInnermostLast(const std::string& text) {
  std::string out;
  std::vector<std::string> frames;
  auto flush = [&] {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) absl::StrAppend(&out, *it, "\n");
    frames.clear();
  };
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "  File ")) {
      frames.emplace_back(line);
      continue;
    }
    flush();
    if (line.empty()) continue;
    std::string header(line);
    const std::string first = "(most recent call first)";
    if (auto pos = header.find(first); pos != std::string::npos) {
      header.replace(pos, first.size(), "(most recent call last)");
    }
    absl::StrAppend(&out, header, "\n");
  }
  flush();
  return out;
}

rdzv::StackDump CaptureStack(const StackTarget& t, rdzv::Duration budget) {
  const Clock::time_point deadline = Clock::now() + budget;
  rdzv::StackDump d;
  d.rank = t.rank;
  d.pid = t.pid;
  d.host = t.host;
  if (t.pid <= 0 || ::kill(t.pid, 0) != 0) {
    d.error = "the worker is not running";
    return d;
  }
  std::string why_python, why_native;
  if (auto py = PythonStack(t, std::min(deadline, Clock::now() + kPythonBudget), &why_python)) {
    d.kind = "python";
    d.text = std::move(*py);
    return d;
  }
  if (auto native = NativeStack(t.pid, deadline, &why_native)) {
    d.kind = "native";
    d.text = std::move(*native);
    return d;
  }
  d.text = KernelStack(t.pid);
  if (!d.text.empty()) {
    d.kind = "kernel";
    return d;
  }
  d.error = absl::StrCat("no stack: ", why_python, "; ", why_native);
  return d;
}

}  // namespace ddprun::agent
