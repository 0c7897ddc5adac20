// OrphanGuard: no worker outlives its agent, not even when the agent is
// killed with SIGKILL and not even the grandchildren of wrapper scripts.
//
// PR_SET_PDEATHSIG covers a worker itself but is not inherited by the
// worker's own children. So at start-up the agent forks one small guard
// process. The agent tells it, over a pipe, the process group of every worker
// it spawns and reaps. When the agent dies, however it dies, the kernel
// closes the pipe; the guard sees end-of-file, SIGKILLs every registered
// process group and exits. On a normal exit the agent says goodbye first and
// the guard exits without killing anything.
//
// The guard ignores terminal signals (it shares the agent's process group)
// and runs only async-signal-safe code, so it may be forked from a process
// that already has threads.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"

namespace ddprun::agent {

class OrphanGuard {
 public:
  // The largest number of process groups the guard tracks at once.
  static constexpr int kMaxGroups = 65536;

  static absl::StatusOr<std::unique_ptr<OrphanGuard>> Start();
  // Says goodbye: the guard exits without killing.
  ~OrphanGuard();

  // Thread-safe. A failed write (guard gone) is ignored: PDEATHSIG still
  // covers the workers themselves.
  void Register(pid_t pgid);
  void Unregister(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  OrphanGuard(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void Send(char op, pid_t pgid);

  const pid_t pid_;
  const int fd_;
  std::mutex mu_;
};

}  // namespace ddprun::agent
