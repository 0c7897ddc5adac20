// The real machine behind SystemProbe (preflight_probe.h), and the gathering
// of one node's local facts over any probe.
#include "ddprun/launcher/check/preflight_probe.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ddprun/agent/host.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/rendezvous/common/sha256.h"

extern char** environ;

namespace ddprun::launcher::preflight {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string Errno(int err) { return std::strerror(err); }

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Accepts and closes connections on its own thread until destroyed.
class TcpListener final : public Listener {
 public:
  TcpListener(int fd, int port) : fd_(fd), port_(port) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) == 0) {
      wake_read_ = pipe_fds[0];
      wake_write_ = pipe_fds[1];
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~TcpListener() override {
    if (wake_write_ >= 0) {
      const char c = 0;
      (void)!::write(wake_write_, &c, 1);
    }
    thread_.join();
    ::close(fd_);
    if (wake_read_ >= 0) ::close(wake_read_);
    if (wake_write_ >= 0) ::close(wake_write_);
  }
  int Port() const override { return port_; }

 private:
  void Loop() {
    for (;;) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
      if (::poll(fds, wake_read_ >= 0 ? 2 : 1, 1000) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) ::close(c);
      }
    }
  }

  int fd_;
  int port_;
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::thread thread_;
};

GpuCount NvmlGpus() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return {0, ""};
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<InitFn>(::dlsym(lib, "nvmlShutdown"));
  GpuCount out{0, ""};
  unsigned n = 0;
  if (init != nullptr && count != nullptr && init() == 0) {
    if (count(&n) == 0) out = {static_cast<int>(n), "nvml"};
    if (shutdown != nullptr) shutdown();
  }
  ::dlclose(lib);
  return out;
}

class RealProbe final : public SystemProbe {
 public:
  std::vector<Interface> Interfaces() override {
    std::vector<Interface> out;
    std::map<std::string, size_t> index;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return out;
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_name == nullptr) continue;
      auto [it, fresh] = index.emplace(a->ifa_name, out.size());
      if (fresh) out.push_back({a->ifa_name, false, false});
      Interface& i = out[it->second];
      i.up = i.up || (a->ifa_flags & IFF_UP) != 0;
      const int family = a->ifa_addr ? a->ifa_addr->sa_family : AF_UNSPEC;
      i.has_address = i.has_address || family == AF_INET || family == AF_INET6;
    }
    ::freeifaddrs(list);
    return out;
  }

  std::optional<std::vector<std::string>> InfinibandDevices() override {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory("/sys/class/infiniband", ec)) return std::nullopt;
    std::vector<std::string> out;
    for (fs::directory_iterator it("/sys/class/infiniband", ec), end; !ec && it != end;
         it.increment(ec)) {
      out.push_back(it->path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  GpuCount Gpus() override {
    if (GpuCount nvml = NvmlGpus(); !nvml.source.empty()) return nvml;
    const int n = CountNvidiaGpus();
    return {n, n > 0 ? "/proc/driver/nvidia" : "none"};
  }

  int Cpus() override { return std::max(1u, std::thread::hardware_concurrency()); }

  ShmSpace Shm() override {
    struct statvfs st {};
    if (::statvfs("/dev/shm", &st) != 0) return {};
    return {static_cast<std::int64_t>(st.f_blocks) * static_cast<std::int64_t>(st.f_frsize),
            static_cast<std::int64_t>(st.f_bavail) * static_cast<std::int64_t>(st.f_frsize)};
  }

  Limits ResourceLimits() override {
    Limits out;
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
      out.nofile_soft = static_cast<std::int64_t>(r.rlim_cur);
    }
    if (::getrlimit(RLIMIT_MEMLOCK, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
      out.memlock_soft = static_cast<std::int64_t>(r.rlim_cur);
    }
    return out;
  }

  std::string Hostname() override { return agent::Hostname(); }
  std::string DdprunVersion() override { return VersionString(); }

  absl::Status Resolve(const std::string& host) override {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0) return absl::UnavailableError(::gai_strerror(rc));
    ::freeaddrinfo(res);
    return absl::OkStatus();
  }

  absl::Status Connect(const std::string& host, int port, Millis timeout) override {
    const auto deadline = SteadyClock::now() + timeout;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
      return absl::UnavailableError(::gai_strerror(rc));
    }
    absl::Status last = absl::UnavailableError("no address");
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      last = ConnectOne(a, deadline);
      if (last.ok()) break;
    }
    ::freeaddrinfo(res);
    return last;
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen() override {
    // Dual-stack: IPv6 any with IPv4-mapped addresses, else IPv4 any.
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      int off = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const int err = errno;
        if (fd >= 0) ::close(fd);
        return absl::UnavailableError(absl::StrCat("cannot bind a TCP port: ", Errno(err)));
      }
    }
    if (::listen(fd, 128) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot listen: ", Errno(err)));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    const int port = ss.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return std::unique_ptr<Listener>(std::make_unique<TcpListener>(fd, port));
  }

  absl::StatusOr<std::string> FileSha256(const std::string& path) override {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      const int err = errno;
      if (err == ENOENT) return absl::NotFoundError("no such file");
      return absl::PermissionDeniedError(Errno(err));
    }
    rendezvous::Sha256 sha;
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) sha.Update(buf, in.gcount());
    return sha.HexDigest();
  }

  PythonVersions Python(const std::string& python, Millis timeout) override;

  std::int64_t WallMicros() override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

 private:
  static absl::Status ConnectOne(const addrinfo* a, SteadyClock::time_point deadline) {
    FdCloser fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) return absl::UnavailableError(Errno(errno));
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return absl::OkStatus();
    if (errno != EINPROGRESS) return absl::UnavailableError(Errno(errno));
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now())
              .count();
      if (left <= 0) return absl::DeadlineExceededError("connect timed out");
      pollfd p{fd.get(), POLLOUT, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) continue;
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return absl::UnavailableError(Errno(err));
      return absl::OkStatus();
    }
  }
};

// The Python probe's program: two lines, the Python and torch versions.
constexpr const char* kVersionsProgram =
    "import platform\n"
    "print(platform.python_version())\n"
    "try:\n"
    "    import torch\n"
    "    print(torch.__version__)\n"
    "except Exception:\n"
    "    print('')\n";

PythonVersions RealProbe::Python(const std::string& python, Millis timeout) {
  PythonVersions out;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    out.error = absl::StrCat("pipe: ", Errno(errno));
    return out;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::string prog = kVersionsProgram;
  std::string dash_c = "-c";
  std::string py = python;
  char* argv[] = {py.data(), dash_c.data(), prog.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, python.c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    out.error = absl::StrCat("cannot run ", python, ": ", Errno(rc));
    return out;
  }
  std::string text;
  const auto deadline = SteadyClock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now())
            .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int prc = ::poll(&p, 1, static_cast<int>(left));
    if (prc < 0 && errno == EINTR) continue;
    if (prc <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    out.error = absl::StrCat(python, " did not answer within ", timeout.count() / 1000, " s");
    return out;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    out.error = absl::StrCat(python, " failed (",
                             WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                               : absl::StrCat("signal ", WTERMSIG(status)),
                             ")");
    return out;
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  out.python = lines.size() > 0 ? lines[0] : "";
  out.torch = lines.size() > 1 ? lines[1] : "";
  return out;
}

bool IsPython(const std::string& arg0) {
  const std::string base = std::filesystem::path(arg0).filename().string();
  return absl::StartsWith(base, "python");
}

std::string OnPath(const std::string& name, const agent::Env& env) {
  if (name.find('/') != std::string::npos) return name;
  auto it = env.find("PATH");
  const std::string path = it != env.end() ? it->second : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

}  // namespace

bool ScriptImportsTorch(const std::string& path) {
  std::ifstream in(path);
  static const std::regex kImport(R"(^\s*(import|from)\s+torch(\W|$))");
  std::string line;
  while (std::getline(in, line)) {
    if (std::regex_search(line, kImport)) return true;
  }
  return false;
}

std::unique_ptr<SystemProbe> MakeSystemProbe() { return std::make_unique<RealProbe>(); }

CommandFile FileOfCommand(const std::vector<std::string>& command, const agent::Env& env) {
  CommandFile out;
  if (command.empty()) return out;
  if (IsPython(command[0])) {
    out.python = command[0];
    // BuildWorkerCommand's forms: python -u SCRIPT ..., python -u -m MODULE ...
    size_t i = 1;
    while (i < command.size() && command[i] == "-u") ++i;
    if (i < command.size() && command[i] != "-m") out.path = command[i];
    return out;
  }
  out.path = OnPath(command[0], env);
  return out;
}

NodeFacts CollectLocalFacts(SystemProbe& probe, const std::vector<std::string>& command,
                            const agent::Env& env, Millis python_timeout) {
  NodeFacts f;
  f.reported = true;
  f.hostname = probe.Hostname();
  for (const char* name : kCheckedVariables) {
    if (auto it = env.find(name); it != env.end()) f.env[name] = it->second;
  }
  f.interfaces = probe.Interfaces();
  f.ib_devices = probe.InfinibandDevices();
  const GpuCount gpus = probe.Gpus();
  f.gpu_count = gpus.count;
  f.gpu_source = gpus.source;
  f.cpu_count = probe.Cpus();
  const ShmSpace shm = probe.Shm();
  f.shm_total = shm.total;
  f.shm_free = shm.free;
  const Limits limits = probe.ResourceLimits();
  f.nofile_soft = limits.nofile_soft;
  f.memlock_soft = limits.memlock_soft;
  f.ddprun_version = probe.DdprunVersion();
  const CommandFile file = FileOfCommand(command, env);
  f.script_path = file.path;
  if (!file.path.empty()) {
    absl::StatusOr<std::string> sum = probe.FileSha256(file.path);
    if (sum.ok()) {
      f.script_sha256 = *sum;
    } else {
      f.script_error = std::string(sum.status().message());
    }
  }
  f.python_command = !file.python.empty();
  f.python_exec = file.python;
  if (f.python_command && !file.path.empty())
    f.script_imports_torch = ScriptImportsTorch(file.path);
  if (f.python_command) {
    const PythonVersions v = probe.Python(file.python, python_timeout);
    f.python_version = v.python;
    f.torch_version = v.torch;
    f.python_error = v.error;
  }
  return f;
}

}  // namespace ddprun::launcher::preflight
