// OrphanGuard: no worker outlives its agent, not even when the agent is
// killed with SIGKILL and not even the grandchildren of wrapper scripts.
//
// PR_SET_PDEATHSIG covers a worker itself but is not inherited by the
// worker's own children. So at start-up the agent starts one small guard
// process. It holds the read end of a socket whose other end only the agent
// holds. When the agent dies, however it dies, the kernel closes the agent's
// end; the guard's read returns end-of-file, it SIGKILLs every process group
// in its table and exits. On a normal exit the agent says goodbye ('q') first
// and the guard exits without killing anything.
//
// The table (the process group of every worker spawned and not yet reaped)
// lives in a shared anonymous mapping that the agent writes with plain atomic
// stores: registering a worker is no system call and wakes nobody.
//
// The guard is a clone(CLONE_VM) of the agent (x86-64 and arm64; a fork
// elsewhere): no page tables copied, and no copy-on-write fault in the agent
// afterwards (a fork made every page the agent later wrote fault once, at
// ~170 us per fault on this project's VM; docs/launch.md). Sharing the
// agent's memory, the guard runs only raw system calls on its own stack
// inside the mapping: no libc call (errno and the rest of libc's per-thread
// state are the agent's main thread's), no allocation. It blocks every
// signal (terminal signals reach the agent's whole process group; the guard
// must survive them to do its job); SIGKILL still ends it.
//
// It also removes, when the agent dies, a directory the agent named
// (RemoveOnDeath): the temporary directory of the workers' error files, which
// a normal exit removes itself. Plain files only, no subdirectories (the flat
// layout of worker_logs.cc), so that raw system calls can do it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent {

class OrphanGuard {
 public:
  // The largest number of process groups the guard tracks at once.
  static constexpr int kMaxGroups = 65536;

  static absl::StatusOr<std::unique_ptr<OrphanGuard>> Start();
  // Dismiss().
  ~OrphanGuard();

  // Says goodbye: the guard exits without killing or removing anything; it
  // is reaped here (bounded wait). Afterwards the calls below do nothing.
  // Idempotent.
  void Dismiss();

  // Thread-safe, no system call. Beyond kMaxGroups groups at once the extra
  // ones are not tracked (PDEATHSIG still covers the workers themselves).
  void Register(pid_t pgid);
  void Unregister(pid_t pgid);
  // Thread-safe, no system call. If the agent dies without saying goodbye,
  // the guard, after killing the groups, unlinks the plain files in `dir`
  // and removes it (best effort: what it cannot remove stays). Set once; a
  // path of kMaxPath bytes or more is not taken. An empty path clears it.
  static constexpr int kMaxPath = 4096;
  void RemoveOnDeath(const std::string& dir);
  pid_t pid() const { return pid_; }

  struct Shared;  // the mapping shared with the guard (orphan_guard.cc)

 private:
  OrphanGuard(pid_t pid, int fd, Shared* shared) : pid_(pid), fd_(fd), shared_(shared) {}

  const pid_t pid_;
  const int fd_;
  Shared* const shared_;
  std::mutex mu_;
  bool dismissed_ = false;       // the guard is gone and shared_ unmapped
  int next_slot_ = 0;            // slots [0, next_slot_) have been used
  std::vector<int> free_slots_;  // used slots now empty
  std::unordered_map<pid_t, int> slot_of_;
};

}  // namespace ddprun::agent
