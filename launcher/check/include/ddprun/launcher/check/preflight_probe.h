// The system probes of `ddprun check`: everything a check worker asks the
// machine, behind one interface so that the exchange (preflight_exchange.h)
// and the fact gathering run in unit tests over a fake machine.
//
// Contract: every call returns within its deadline (connect, the Python
// probe) or does no blocking I/O beyond reading /proc and /sys.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/launcher/check/preflight.h"

namespace ddprun::launcher::preflight {

using Millis = std::chrono::milliseconds;

// A listening TCP socket that accepts and closes connections until it is
// destroyed: what the other nodes connect to.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual int Port() const = 0;
};

struct GpuCount {
  int count = 0;
  std::string source;  // "nvml", "/proc/driver/nvidia", "none"
};

struct ShmSpace {
  std::int64_t total = -1;  // bytes; -1: no /dev/shm
  std::int64_t free = -1;
};

struct Limits {
  std::int64_t nofile_soft = -1;   // -1: unlimited
  std::int64_t memlock_soft = -1;  // bytes; -1: unlimited
};

struct PythonVersions {
  std::string python;  // "3.11.2"; "" with error set
  std::string torch;   // "1.13.0"; "": torch not importable
  std::string error;
};

class SystemProbe {
 public:
  virtual ~SystemProbe() = default;
  virtual std::vector<Interface> Interfaces() = 0;
  virtual std::optional<std::vector<std::string>> InfinibandDevices() = 0;
  virtual GpuCount Gpus() = 0;
  virtual int Cpus() = 0;
  virtual ShmSpace Shm() = 0;
  virtual Limits ResourceLimits() = 0;
  virtual std::string Hostname() = 0;
  virtual std::string DdprunVersion() = 0;
  // OK, or the resolver's error as one line.
  virtual absl::Status Resolve(const std::string& host) = 0;
  // One TCP connection, closed at once; Unavailable/DeadlineExceeded naming why.
  // Called from several threads at once.
  virtual absl::Status Connect(const std::string& host, int port, Millis timeout) = 0;
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen() = 0;
  // The file's SHA-256 in hex; NotFound / PermissionDenied with the reason.
  virtual absl::StatusOr<std::string> FileSha256(const std::string& path) = 0;
  // `python -c` printing the Python and torch versions, killed after timeout.
  virtual PythonVersions Python(const std::string& python, Millis timeout) = 0;
  // Wall-clock time (the clock compared between nodes), microseconds since the epoch.
  virtual std::int64_t WallMicros() = 0;
};

// The real machine: getifaddrs, /sys/class/infiniband, NVML (dlopen) or
// /proc/driver/nvidia, statvfs(/dev/shm), getrlimit, getaddrinfo, sockets,
// OpenSSL's SHA-256, posix_spawn.
std::unique_ptr<SystemProbe> MakeSystemProbe();

// What runs in each worker, as the check sees it: the script file (if any)
// and whether it is a Python interpreter. `env` supplies PATH.
struct CommandFile {
  std::string path;    // "" when there is no file (python -m MODULE)
  std::string python;  // the interpreter when the command runs one, else ""
};
CommandFile FileOfCommand(const std::vector<std::string>& command, const agent::Env& env);

// Whether the Python file at `path` has a line `import torch...` or
// `from torch... import` at any indentation (false when it cannot be read).
bool ScriptImportsTorch(const std::string& path);

// The variables the checks read (preflight.h NodeFacts::env).
inline constexpr const char* kCheckedVariables[] = {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                                    "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                                                    "CUDA_VISIBLE_DEVICES"};

// This node's facts that need no other node: environment, interfaces,
// devices, limits, versions, the script's checksum.
NodeFacts CollectLocalFacts(SystemProbe& probe, const std::vector<std::string>& command,
                            const agent::Env& env, Millis python_timeout);

}  // namespace ddprun::launcher::preflight
