// The warm start of in-place replacements (--restart_policy=inplace with a
// Python entrypoint; docs/recovery.md, "Warm start"): one interpreter per
// node that has already imported the heavy modules (--warm_modules), which
// becomes the next replacement worker instead of a fresh interpreter that
// imports them again. Its program is warm_bootstrap.py (the protocol is
// there).
//
// The standby is an ordinary child of the agent's ProcessLauncher (its own
// process group, the death signal, the orphan guard), but it is not a worker:
// it has no rank, no output (/dev/null) and no metrics, and nothing counts it
// until Activate() hands it one rank's SpawnSpec, exactly what a cold spawn
// of that rank would get (argv, the whole environment, stdout/stderr, the
// inherited descriptors under their numbers, the CPUs), and returns its
// ChildProcess for the agent to adopt as that rank's worker. The script then
// runs as __main__ (runpy) in the standby's process.
//
// Single-threaded: the agent's main thread only (it spawns: the death signal
// is tied to the spawning thread).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"  // kWarmModulesOff
#include "ddprun/agent/process_launcher.h"

namespace ddprun::agent {

// Filler in the standby's environment at exec, so that the area the kernel
// shows as /proc/<pid>/environ can take a rank's environment once the
// standby becomes that rank's worker (warm_bootstrap.py writes it there).
// Never in a worker's os.environ.
inline constexpr char kEnvWarmRoom[] = "DDPRUN_WARM_ROOM";

class WarmStandby {
 public:
  using Logger = std::function<void(const std::string&)>;

  // `modules`: what the standby imports (comma-separated, --warm_modules);
  // `log` gets the standby's one-line notices (fenced by the caller).
  WarmStandby(ProcessLauncher& launcher, std::string modules, Logger log);
  ~WarmStandby();  // Stop()
  WarmStandby(const WarmStandby&) = delete;
  WarmStandby& operator=(const WarmStandby&) = delete;

  // Whether `argv` runs Python the way ddprun builds a Python entrypoint
  // (launcher/src/worker_command.cc): PYTHON -u SCRIPT.py ARGS or
  // PYTHON -u -m MODULE ARGS. Anything else (--no_python, a directory)
  // always starts cold.
  static bool Supports(const std::vector<std::string>& argv);

  // Starts a standby for workers spawned like `like` (its interpreter, its
  // environment without the per-rank descriptors and files) unless one is
  // alive; it holds the descriptor numbers in `reserved` (those the workers
  // inherit) for the worker it becomes.
  absl::Status Start(const SpawnSpec& like, const std::set<int>& reserved);
  // Whether a standby process is alive (reaps one that exited, with a line).
  bool Alive();
  // Whether its imports are done (reads its line; says once which modules
  // it could not import, unless they are the default's: an interpreter
  // without torch simply has nothing to import ahead).
  bool Ready();
  pid_t pid() const;
  // How many standbys exited before they were used (each said on the console).
  int failures() const { return failures_; }

  // Why `spec` cannot run in the standby ("" when it can): another
  // interpreter or flags, a descriptor it did not reserve, or a variable read
  // at the interpreter's start (PYTHON*, LD_*, OMP_*, LANG, LC_*, ...) whose
  // value differs from the standby's.
  std::string Mismatch(const SpawnSpec& spec) const;
  // Hands `spec` to the standby and returns its process, now that rank's
  // worker; this object then holds no standby. On an error the standby is
  // stopped and the caller starts the worker cold.
  absl::StatusOr<std::unique_ptr<ChildProcess>> Activate(const SpawnSpec& spec);
  // Kills (SIGKILL to its group) and reaps the standby, if any.
  void Stop();

 private:
  ProcessLauncher& launcher_;
  const std::string modules_;
  const Logger log_;
  std::unique_ptr<ChildProcess> child_;
  int sock_ = -1;  // the agent's end of the standby's socket
  std::string line_;
  bool ready_ = false;
  int failures_ = 0;
  std::vector<std::string> interpreter_;            // argv[0], "-u"
  std::map<std::string, std::string> startup_env_;  // the variables Mismatch compares
  std::set<int> reserved_;
};

}  // namespace ddprun::agent
