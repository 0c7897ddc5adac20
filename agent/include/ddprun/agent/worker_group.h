// The workers of one round on this node: spawn, signal, reap, over the
// ProcessLauncher seam (process_launcher.h) and an injected Clock.
//
// Stopping is bounded: the stop signal to every live group, the grace
// period, SIGKILL, then at most `reap_timeout` for the kernel to reap them.
// The group never blocks by itself: every wait goes through the caller's
// Waiter, which waits on the agent's event queue (so a second Ctrl-C during
// a stop is seen at once).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::agent {

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  std::unique_ptr<ChildProcess> child;  // null when the spawn failed
  std::optional<ExitStatus> exit;
  double exited_at = 0;               // wall-clock epoch seconds when the exit was seen
  rendezvous::TimePoint exit_seen{};  // the same on the group's clock (orders failures)
  bool stopped_by_agent = false;
  std::string error_file;
  std::string spawn_error;  // why Spawn failed
};

class WorkerGroup {
 public:
  // Waits until `deadline` or an event, whichever comes first. Returns false
  // when the stop must escalate at once (a terminating signal arrived).
  using Waiter = std::function<bool(rendezvous::TimePoint deadline)>;
  using Logger = std::function<void(const std::string&)>;

  // Workers are polled at least this often while waiting (a safety net for a
  // lost SIGCHLD; the waits sleep on the event queue in between).
  static constexpr rendezvous::Duration kPollInterval = std::chrono::seconds(1);
  // After SIGKILL, how long to wait for the kernel to reap a worker before
  // giving up on it (a process in uninterruptible sleep cannot die).
  static constexpr rendezvous::Duration kReapTimeout = std::chrono::seconds(5);

  WorkerGroup(ProcessLauncher& launcher, const rendezvous::Clock& clock);

  // Forgets the previous round's workers (they must have been stopped).
  void Clear();
  // Starts one worker. When `prepared` is an error, or Spawn fails, the
  // worker is recorded as exited 127 with the reason in spawn_error, and
  // Spawn returns that error.
  absl::Status Spawn(int local_rank, int global_rank, const SpawnSpec& spec, std::string error_file,
                     const absl::Status& prepared);

  // --restart_policy=inplace: hands over every worker (the group is then
  // empty), so that the survivors can be adopted into the next round.
  std::vector<Worker> TakeWorkers();
  // Adds a running worker of an earlier round as this round's, under its
  // global rank in this round.
  void Adopt(Worker w, int global_rank);

  // Reaps the workers that exited (non-blocking).
  void Poll();
  bool AnyAlive() const;
  // A worker exited with a non-zero status or a signal.
  bool AnyFailed() const;
  // `sig` to every live worker's process group; mark_stopped: its exit is
  // the agent's doing, not a failure.
  void Signal(int sig, bool mark_stopped);

  // Waits for every worker to exit until `deadline`. Returns false early
  // when `wait` does.
  bool WaitUntil(rendezvous::TimePoint deadline, const Waiter& wait);
  // Stops every live worker: `sig`, `grace`, SIGKILL, kReapTimeout. Logs
  // the escalation and the workers it had to give up on.
  void Stop(int sig, rendezvous::Duration grace, const Waiter& wait, const Logger& log);

  const std::vector<Worker>& workers() const { return workers_; }

 private:
  ProcessLauncher& launcher_;
  const rendezvous::Clock& clock_;
  std::vector<Worker> workers_;
};

}  // namespace ddprun::agent
