// Process spawning behind an interface (as Ray's StartProcess), so that the
// agent's supervision logic is unit-tested with a fake.
//
// Contract of every implementation:
//  - each child runs in its own process group (pgid == pid), so a signal to
//    the group reaches grandchildren started by wrapper scripts;
//  - each child gets PR_SET_PDEATHSIG(SIGKILL): if the agent dies, even by
//    kill -9, the child dies too. The death signal is tied to the spawning
//    thread, so spawn from a thread that lives as long as the agent;
//  - the child starts with an empty signal mask and default dispositions.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent {

struct SpawnSpec {
  std::vector<std::string> argv;           // argv[0] is resolved through PATH.
  std::map<std::string, std::string> env;  // the complete environment.
  std::string stdout_path;                 // empty: inherit the agent's stdout.
  std::string stderr_path;                 // empty: inherit the agent's stderr.
  // When >= 0, the child's stdout/stderr is this descriptor (a pipe to the
  // agent's log pump) instead of a path; the caller keeps and closes it.
  int stdout_fd = -1;
  int stderr_fd = -1;
  // Non-empty: the child's CPU affinity (sched_setaffinity before exec;
  // --cpu_bind, cpu_binding.h). A CPU the kernel refuses fails the spawn.
  std::vector<int> cpus;
  // Descriptors of the caller that the child inherits under the same
  // numbers (the worker's checkpoint memory); every other one above 2 is
  // closed at exec. The caller keeps and closes them.
  std::vector<int> inherit_fds;
};

// How a child ended.
struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the terminating signal, 0 if it exited.
  bool ok() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "signal SIGKILL (9)".
  std::string Describe() const;
};

class ChildProcess {
 public:
  virtual ~ChildProcess() = default;
  virtual pid_t pid() const = 0;
  // Non-blocking: reaps the child if it has exited. Once it returns a value,
  // it keeps returning the same value.
  virtual std::optional<ExitStatus> Poll() = 0;
  // Sends sig to the child's process group (no-op once reaped).
  virtual void SignalGroup(int sig) = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  virtual absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) = 0;
  // A directory of plain files (the workers' temporary error files) that the
  // launcher removes itself at a normal exit; this one removes it if the
  // agent dies without one (SIGKILL), as it kills the workers then. Default:
  // nothing (the fakes).
  virtual void RemoveOnDeath(const std::string& /*dir*/) {}
  // Called once no child of this launcher is alive and none will be
  // spawned: ends the launcher's helpers now rather than at destruction
  // (the real one's orphan guard is dismissed and reaped), so that a process
  // that ends without destroying the launcher leaves nothing behind.
  // Idempotent. Default: nothing.
  virtual void Close() {}
};

// The real launcher, over Boost.Process.
std::unique_ptr<ProcessLauncher> MakeBoostProcessLauncher();

}  // namespace ddprun::agent
