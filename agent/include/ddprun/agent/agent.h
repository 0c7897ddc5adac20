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
// Exit codes: rendezvous/exit_codes.h.
//
// The agent is built from seams (all injected, so that the loop is
// unit-tested without sockets, processes or sleeps):
//   ProcessLauncher (process_launcher.h)   spawns the workers;
//   RendezvousSession (rendezvous_session.h)  joins, reports, leaves;
//   Clock (rendezvous/clock.h)            every timeout;
//   EventQueue (events.h)                 what the main thread waits on.
#pragma once

#include <memory>

#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/events.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::agent {

// What the agent runs on. A null member gets the real one.
struct AgentDeps {
  std::unique_ptr<ProcessLauncher> launcher;   // null: MakeBoostProcessLauncher()
  std::unique_ptr<RendezvousSession> session;  // null: MakeRendezvousSession()
  const rendezvous::Clock* clock = nullptr;    // null: SystemClock
  // Null: a real queue fed by a SignalWatcher thread. A caller's queue gets
  // no signal watcher: the caller pushes whatever events it wants seen.
  EventQueue* events = nullptr;
};

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<ProcessLauncher> launcher);
  Agent(AgentOptions options, AgentDeps deps);
  ~Agent();
  // Runs the node until the job ends; returns the process exit code. Must be
  // called on the main thread after BlockAgentSignals() (events.h). On
  // return, everything another process or the user sees is done: the
  // workers' output flushed and their files closed, the temporary directory
  // removed, the rendezvous left (RendezvousSession::Leave), the orphan guard
  // dismissed. The destructor then joins the agent's threads, which hold
  // only this process's memory: a process that ends right after Run() may
  // skip it (launcher/src/main.cc does).
  int Run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
