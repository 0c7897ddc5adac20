// Taking a live worker's stack for a hang report (docs/monitoring-sources.md),
// without stopping or killing it, in bounded time:
//   python  the worker's start-up hook registered faulthandler on a signal
//           (the channel says which, and which process): send it, read what
//           faulthandler appended to the worker's stack file;
//   native  `gdb -p PID -batch -ex "thread apply all bt"` when gdb is on the
//           PATH (the worker pauses while gdb reads it, then goes on);
//   kernel  /proc/PID/wchan, syscall and stack: where each thread sleeps.
// Each step falls through to the next when it cannot be had.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/monitoring/metrics_channel.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::agent {

struct StackTarget {
  int rank = 0;
  pid_t pid = 0;  // the worker (a process group leader)
  std::string host;
  int stack_fd = -1;  // the agent's descriptor of the worker's stack file
  std::optional<rendezvous::ChannelSnapshot> channel;
};

// At most `budget` of wall time (gdb gets what the Python step left).
rendezvous::StackDump CaptureStack(const StackTarget& target, rendezvous::Duration budget);

// faulthandler's dump ("most recent call first") turned into the report's
// order: per thread, innermost frame last, like a Python traceback.
std::string PythonStackInnermostLast(const std::string& faulthandler_text);

}  // namespace ddprun::agent
