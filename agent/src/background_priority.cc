#include "ddprun/agent/background_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ddprun::agent {
namespace {

// setpriority(PRIO_PROCESS, tid) sets one thread's nice value on Linux.
bool SetNice(int nice) {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  return ::setpriority(PRIO_PROCESS, tid, nice) == 0;
}

}  // namespace

void LowerThreadPriority() { (void)SetNice(kBackgroundNice); }

bool RestoreThreadPriority() { return SetNice(0); }

}  // namespace ddprun::agent
