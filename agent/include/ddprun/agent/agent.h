// The per-node agent: joins the job's rounds, spawns the node's workers with
// their environment, watches them and reacts to their exits, to the
// rendezvous (restart, close) and to signals.
//
// Lifecycle of one round:
//  1. Join and wait for the Assignment (bounded by the join timeout).
//  2. Spawn nproc workers (own process group, PDEATHSIG).
//  3. Wait for the first of: a worker exit, a RoundEvent, a signal.
//     - all workers exited 0: Report(SUCCEEDED), exit 0;
//     - a worker failed: stop the rest (SIGTERM, grace, SIGKILL),
//       Report(FAILED) and wait for the daemon's decision (restart or close);
//     - RestartRound: stop workers, back to 1;
//     - JobClosed: stop workers, print the job's failure report, exit 1;
//     - SIGINT/SIGTERM/SIGHUP/SIGQUIT: forward to every worker group, grace,
//       SIGKILL, Report(LEAVING), exit 128+signal.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/process_launcher.h"

namespace ddprun::agent {

// Exit codes of ddprun.
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitWorkerFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRendezvousError = 3;

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<ProcessLauncher> launcher);
  ~Agent();
  // Runs the node until the job ends; returns the process exit code. Must be
  // called on the main thread after BlockAgentSignals().
  int Run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks the signals the agent handles (SIGCHLD, SIGINT, SIGTERM, SIGHUP,
// SIGQUIT, SIGUSR1, SIGUSR2) in the calling thread; call first in main() so
// every later thread inherits the mask.
void BlockAgentSignals();

}  // namespace ddprun::agent
