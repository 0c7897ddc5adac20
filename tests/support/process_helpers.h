// Helpers for the multi-process tests: spawn real ddprun / ddprund /
// fixture_worker processes with their output in files, wait for them with a
// deadline, read what the fixture workers saw, and make sure no process of a
// test outlives it.
//
// Every test builds one Harness. It owns a mkdtemp directory and every
// process started through it; its destructor SIGKILLs whatever is still
// running (the launcher's process group and every pid a fixture worker wrote
// to a pid directory), so a failed REQUIRE never leaks processes into the
// next test. The test process is a child subreaper, so workers orphaned by a
// killed launcher are reparented to it and reaped here (PID 1 of the test
// container does not reap zombies, and a zombie still answers kill(pid, 0)).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace ddprun::test {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The build's executables; DDPRUN_TEST_BIN_DIR moves them (a bundle run on
// another machine: scripts/gpu-bundle.sh).
inline std::string Bin(const std::string& name) {
  const char* dir = std::getenv("DDPRUN_TEST_BIN_DIR");
  return std::string(dir && *dir ? dir : DDPRUN_BIN_DIR) + "/" + name;
}
inline std::string Ddprun() { return Bin("ddprun"); }
inline std::string Ddprund() { return Bin("ddprund"); }
inline std::string FixtureWorker() { return Bin("fixture_worker"); }

// The command line that runs the cases of `tags` in a Catch2 rank program
// (sdk_worker, gpu_worker): {program, tags, "-w", "NoTests"}. Catch2 v2 exits
// 0 when a filter matches no case; "-w NoTests" makes that exit 2, so a
// misspelt or renamed tag fails the job instead of passing without a check.
inline std::vector<std::string> CatchRun(const std::string& program, const std::string& tags) {
  return {program, tags, "-w", "NoTests"};
}

// a, then b.
inline std::vector<std::string> Concat(std::vector<std::string> a,
                                       const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}

inline void RemoveTree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& n : ListDir(path)) RemoveTree(path + "/" + n);
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

// A port on 127.0.0.1 that was free a moment ago (nobody listens on it).
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A plain TCP socket listening on 127.0.0.1 that never speaks (not gRPC).
struct SilentListener {
  int fd = -1;
  int port = 0;
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~SilentListener() {
    if (fd >= 0) ::close(fd);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
};

// Whether pid is a live process (a zombie counts as gone). Reaps it first if
// it is our child (directly, or adopted as the subreaper).
inline bool IsAlive(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  ::waitpid(pid, &status, WNOHANG);
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  std::size_t close = stat.rfind(')');
  if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') return false;
  return true;
}

// Reaps any adopted orphans (we are a subreaper) without blocking on ours.
inline void ReapOrphans(const std::set<pid_t>& ours) {
  for (;;) {
    int status = 0;
    // Only reap children that are not tracked Procs: waitpid(-1) could steal
    // a tracked child's status, so reap by scanning /proc for our children.
    bool reaped = false;
    for (const std::string& n : ListDir("/proc")) {
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
      pid_t pid = static_cast<pid_t>(std::stol(n));
      if (ours.count(pid)) continue;
      std::string stat = ReadFile("/proc/" + n + "/stat");
      std::size_t close = stat.rfind(')');
      if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z')
        continue;
      std::istringstream rest(stat.substr(close + 2));
      char state = 0;
      long ppid = 0;
      rest >> state >> ppid;
      if (ppid == ::getpid() && ::waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    }
    if (!reaped) return;
  }
}

// Every live descendant of pid (children, grandchildren, ...), from
// /proc/<pid>/task/<tid>/children.
inline std::vector<pid_t> Descendants(pid_t pid) {
  std::vector<pid_t> out;
  std::vector<pid_t> todo{pid};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    const std::string task = "/proc/" + std::to_string(p) + "/task";
    for (const std::string& tid : ListDir(task)) {
      std::istringstream ss(ReadFile(task + "/" + tid + "/children"));
      long c = 0;
      while (ss >> c) {
        out.push_back(static_cast<pid_t>(c));
        todo.push_back(static_cast<pid_t>(c));
      }
    }
  }
  return out;
}

// The decoded wait status: the exit code, or 128+signal as a shell reports it.
inline int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

struct Proc {
  std::string name;
  pid_t pid = -1;
  std::string out_path, err_path;
  std::optional<int> exit;  // DecodeStatus, once reaped
  Clock::time_point started;
  Clock::time_point ended;

  std::string Out() const { return ReadFile(out_path); }
  std::string Err() const { return ReadFile(err_path); }
  double Seconds() const { return std::chrono::duration<double>(ended - started).count(); }
};

// The first match of `re`'s group 1 in p's stdout and stderr, polled every
// 50 ms; FAILs with the output after timeout_s.
inline std::string AwaitOutput(const Proc& p, const std::regex& re, double timeout_s) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < timeout_s) {
    std::smatch m;
    const std::string text = p.Out() + p.Err();
    if (std::regex_search(text, m, re)) return m[1];
    SleepMs(50);
  }
  FAIL("no match for the expected line in " << timeout_s << " s:\n" << p.Out() << p.Err());
  return "";
}

// The monitoring port from a "dashboard at http[s]://HOST:PORT/" line (ddprund's
// or ddprun's), waiting up to timeout_s for it.
inline int DashboardPort(const Proc& p, double timeout_s = 10) {
  return std::stoi(AwaitOutput(p, std::regex("dashboard at https?://[^ /]*:([0-9]+)/"), timeout_s));
}

// What one fixture worker saw: the key=value pairs of its FIXTURE line, and
// the round from its file name (rank<R>.round<N>.txt). Incomplete files
// (a worker killed while writing) are left out.
struct Record {
  std::map<std::string, std::string> kv;
  long round = -1;
  std::string file;
  long Int(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end()) FAIL("record " << file << " has no " << k);
    return it == kv.end() ? 0 : std::stol(it->second);
  }
  std::string Str(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end()) FAIL("record " << file << " has no " << k);
    return it == kv.end() ? std::string() : it->second;
  }
};

inline std::vector<Record> ReadRecords(const std::string& dir) {
  std::vector<Record> out;
  for (const std::string& n : ListDir(dir)) {
    if (n.size() < 4 || n.substr(n.size() - 4) != ".txt") continue;
    Record r;
    r.file = dir + "/" + n;
    std::size_t p = n.find(".round");
    if (p != std::string::npos) r.round = std::stol(n.substr(p + 6));
    const std::string text = ReadFile(r.file);
    // A worker stopped by the agent (the others after a failure) may die
    // between creating its file and writing the line: skip such a record.
    if (text.empty() || text.back() != '\n') continue;
    std::istringstream ss(text);
    std::string tok;
    ss >> tok;
    if (tok != "FIXTURE") FAIL("not a fixture record: " << r.file);
    while (ss >> tok) {
      std::size_t eq = tok.find('=');
      if (eq != std::string::npos) r.kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    out.push_back(std::move(r));
  }
  return out;
}

inline std::vector<Record> RecordsOfRound(const std::vector<Record>& all, long round) {
  std::vector<Record> out;
  for (const Record& r : all)
    if (r.round == round) out.push_back(r);
  return out;
}

inline std::vector<pid_t> ReadPids(const std::string& dir) {
  std::vector<pid_t> pids;
  for (const std::string& n : ListDir(dir)) {
    if (n.size() < 4 || n.substr(n.size() - 4) != ".pid") continue;
    std::string s = ReadFile(dir + "/" + n);
    if (!s.empty()) pids.push_back(static_cast<pid_t>(std::stol(s)));
  }
  return pids;
}

using EnvList = std::vector<std::pair<std::string, std::string>>;

class Harness {
 public:
  Harness() {
    static const bool subreaper = [] { return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0; }();
    REQUIRE(subreaper);
    char tmpl[] = "/tmp/ddprun-mp-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
  }

  ~Harness() {
    // Kill whatever is left: launchers (their process group) and workers.
    for (Proc& p : procs_) {
      if (!p.exit) {
        ::kill(-p.pid, SIGKILL);
        ::kill(p.pid, SIGKILL);
        int status = 0;
        ::waitpid(p.pid, &status, 0);
        p.exit = DecodeStatus(status);
      }
    }
    for (const std::string& d : pid_dirs_)
      for (pid_t pid : ReadPids(d))
        if (IsAlive(pid)) ::kill(pid, SIGKILL);
    const auto t0 = Clock::now();
    for (const std::string& d : pid_dirs_)
      for (pid_t pid : ReadPids(d))
        while (IsAlive(pid) && SecondsSince(t0) < 5) SleepMs(5);
    ReapOrphans({});
    if (std::getenv("DDPRUN_KEEP_TMP") == nullptr) RemoveTree(dir_);
  }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  const std::string& dir() const { return dir_; }

  // An executable file `name` in dir() holding `text` (a worker script).
  std::string Script(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
    return path;
  }

  std::string MakeDir(const std::string& name) {
    std::string d = dir_ + "/" + name;
    REQUIRE(::mkdir(d.c_str(), 0755) == 0);
    return d;
  }

  // A directory for FIXTURE_PIDFILE_DIR; its pids are checked and killed at the end.
  std::string PidDir(const std::string& name) {
    std::string d = MakeDir(name);
    pid_dirs_.push_back(d);
    return d;
  }

  // Starts argv[0] (an absolute path, or a name on PATH) in its own process
  // group, stdout to <dir>/<name>.out and stderr to <dir>/<name>.err, with
  // this process's environment overlaid with env.
  Proc& Start(const std::string& name, const std::vector<std::string>& argv,
              const EnvList& env = {}) {
    Proc p;
    p.name = name;
    p.out_path = dir_ + "/" + name + ".out";
    p.err_path = dir_ + "/" + name + ".err";

    std::map<std::string, std::string> merged;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      std::size_t eq = kv.find('=');
      if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : env) merged[k] = v;
    std::vector<std::string> env_strs;
    for (const auto& [k, v] : merged) env_strs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& s : env_strs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = argv;
    std::vector<char*> cargv;
    for (std::string& s : args) cargv.push_back(s.data());
    cargv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, p.out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, p.err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty, all;
    sigemptyset(&empty);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    REQUIRE(rc == 0);
    p.pid = pid;
    p.started = Clock::now();
    procs_.push_back(std::move(p));
    return procs_.back();
  }

  // Starts ddprun with the given flags and worker command.
  Proc& StartDdprun(const std::string& name, const std::vector<std::string>& args,
                    const EnvList& env = {}) {
    std::vector<std::string> argv{Ddprun()};
    argv.insert(argv.end(), args.begin(), args.end());
    return Start(name, argv, env);
  }

  // Waits for p to exit, at most timeout_s. On timeout, SIGKILLs its process
  // group and fails the test. Returns the exit code (128+signal if killed).
  int Wait(Proc& p, double timeout_s) {
    if (p.exit) return *p.exit;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      int status = 0;
      pid_t r = ::waitpid(p.pid, &status, WNOHANG);
      if (r == p.pid) {
        p.ended = Clock::now();
        p.exit = DecodeStatus(status);
        return *p.exit;
      }
      if (r != 0) FAIL("waitpid(" << p.pid << ") failed: " << std::strerror(errno));
      if (Clock::now() >= deadline) break;
      SleepMs(5);
    }
    ::kill(-p.pid, SIGKILL);
    ::kill(p.pid, SIGKILL);
    int status = 0;
    ::waitpid(p.pid, &status, 0);
    p.ended = Clock::now();
    p.exit = DecodeStatus(status);
    FAIL(p.name << " (pid " << p.pid << ") did not exit within " << timeout_s
                << " s; killed it.\nstdout:\n"
                << p.Out() << "\nstderr:\n"
                << p.Err());
    return -1;
  }

  // Starts ddprund on 127.0.0.1 with --port 0 and --dashboard_port 0 (tests
  // run in parallel: never the fixed default ports) and extra flags, and
  // returns its port, parsed from its ready line. env overlays the test's.
  int StartDaemon(const std::string& name, Proc** out = nullptr,
                  const std::vector<std::string>& extra = {}, const EnvList& env = {}) {
    std::vector<std::string> argv{Ddprund(), "--host",           "127.0.0.1", "--port",
                                  "0",       "--dashboard_port", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Proc& d = Start(name, argv, env);
    if (out) *out = &d;
    const auto t0 = Clock::now();
    while (SecondsSince(t0) < 10) {
      std::string text = d.Out();
      const std::string prefix = "ddprund listening on ";
      std::size_t at = text.find(prefix);
      std::size_t nl = text.find('\n', at == std::string::npos ? 0 : at);
      if (at != std::string::npos && nl != std::string::npos) {
        std::string addr = text.substr(at + prefix.size(), nl - at - prefix.size());
        std::size_t colon = addr.rfind(':');
        REQUIRE(colon != std::string::npos);
        int port = std::stoi(addr.substr(colon + 1));
        REQUIRE(port > 0);
        return port;
      }
      int status = 0;
      if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
        d.exit = DecodeStatus(status);
        FAIL("ddprund exited early with " << *d.exit << ": " << d.Err());
      }
      SleepMs(5);
    }
    FAIL("ddprund printed no ready line within 10 s: " << d.Out() << d.Err());
    return -1;
  }

  // Stops a daemon with SIGTERM; it must exit 0 promptly.
  void StopDaemon(Proc& d) {
    REQUIRE_FALSE(d.exit.has_value());
    REQUIRE(::kill(d.pid, SIGTERM) == 0);
    int rc = Wait(d, 10);
    INFO("ddprund stderr: " << d.Err());
    CHECK(rc == 0);
  }

  // Waits until dir holds n pid files of live processes; returns the pids.
  std::vector<pid_t> WaitForPids(const std::string& dir, std::size_t n, double timeout_s) {
    const auto t0 = Clock::now();
    while (SecondsSince(t0) < timeout_s) {
      std::vector<pid_t> pids = ReadPids(dir);
      if (pids.size() >= n) return pids;
      SleepMs(5);
    }
    FAIL("only " << ReadPids(dir).size() << " of " << n << " workers wrote a pid file in " << dir
                 << " within " << timeout_s << " s");
    return {};
  }

  // Asserts that every process whose pid is in dir is gone within within_s.
  void RequireAllGone(const std::string& dir, double within_s) {
    INFO("pid directory " << dir);
    RequireAllGone(ReadPids(dir), within_s);
  }

  // Asserts that every process in pids is gone within within_s.
  void RequireAllGone(const std::vector<pid_t>& pids, double within_s) {
    const auto t0 = Clock::now();
    std::vector<pid_t> alive;
    do {
      alive.clear();
      for (pid_t pid : pids)
        if (IsAlive(pid)) alive.push_back(pid);
      if (alive.empty()) break;
      SleepMs(5);
    } while (SecondsSince(t0) < within_s);
    INFO("pids still alive after " << within_s << " s: " << Join(alive));
    REQUIRE(alive.empty());
  }

  static std::string Join(const std::vector<pid_t>& pids) {
    std::string s;
    for (pid_t p : pids) s += std::to_string(p) + " ";
    return s;
  }

 private:
  std::string dir_;
  std::deque<Proc> procs_;
  std::vector<std::string> pid_dirs_;
};

// Whether the process has SIGTERM ignored (from /proc/<pid>/status SigIgn).
inline bool IgnoresSigterm(pid_t pid) {
  for (const std::string& line : Lines(ReadFile("/proc/" + std::to_string(pid) + "/status"))) {
    if (line.rfind("SigIgn:", 0) == 0) {
      unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> (SIGTERM - 1)) & 1ULL;
    }
  }
  return false;
}

}  // namespace ddprun::test
