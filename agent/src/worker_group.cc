#include "ddprun/agent/worker_group.h"

#include <signal.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/events.h"

namespace ddprun::agent {
namespace {

double EpochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

WorkerGroup::WorkerGroup(ProcessLauncher& launcher, const rendezvous::Clock& clock)
    : launcher_(launcher), clock_(clock) {}

void WorkerGroup::Clear() { workers_.clear(); }

absl::Status WorkerGroup::Spawn(int local_rank, int global_rank, const SpawnSpec& spec,
                                std::string error_file, const absl::Status& prepared) {
  Worker w;
  w.local_rank = local_rank;
  w.global_rank = global_rank;
  w.error_file = std::move(error_file);
  auto child = prepared.ok() ? launcher_.Spawn(spec)
                             : absl::StatusOr<std::unique_ptr<ChildProcess>>(prepared);
  absl::Status result = child.status();
  if (child.ok()) {
    w.child = std::move(*child);
  } else {
    w.spawn_error = std::string(child.status().message());
    w.exit = ExitStatus{127, 0};
    w.exited_at = EpochSeconds();
    w.exit_seen = clock_.Now();
  }
  workers_.push_back(std::move(w));
  return result;
}

std::vector<Worker> WorkerGroup::TakeWorkers() {
  std::vector<Worker> out = std::move(workers_);
  workers_.clear();
  return out;
}

void WorkerGroup::Adopt(Worker w, int global_rank) {
  w.global_rank = global_rank;
  workers_.push_back(std::move(w));
}

void WorkerGroup::Poll() {
  for (Worker& w : workers_) {
    if (w.exit || !w.child) continue;
    if (auto st = w.child->Poll()) {
      w.exit = st;
      w.exited_at = EpochSeconds();
      w.exit_seen = clock_.Now();
    }
  }
}

bool WorkerGroup::AnyAlive() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.exit; });
}

bool WorkerGroup::AnyFailed() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const Worker& w) { return w.exit && !w.exit->ok(); });
}

void WorkerGroup::Signal(int sig, bool mark_stopped) {
  for (Worker& w : workers_) {
    if (w.exit || !w.child) continue;
    w.child->SignalGroup(sig);
    if (mark_stopped) w.stopped_by_agent = true;
  }
}

bool WorkerGroup::WaitUntil(rendezvous::TimePoint deadline, const Waiter& wait) {
  Poll();
  while (AnyAlive()) {
    const rendezvous::TimePoint now = clock_.Now();
    if (now >= deadline) return true;
    if (!wait(std::min(deadline, now + kPollInterval))) return false;
    Poll();
  }
  return true;
}

void WorkerGroup::Stop(int sig, rendezvous::Duration grace, const Waiter& wait, const Logger& log) {
  Poll();
  if (!AnyAlive()) return;
  Signal(sig, true);
  const bool patient = WaitUntil(clock_.Now() + grace, wait);
  if (AnyAlive()) {
    if (patient) {
      log(absl::StrCat("workers did not exit within ", std::chrono::duration<double>(grace).count(),
                       " s of ", SignalName(sig), "; sending SIGKILL"));
    }
    Signal(SIGKILL, true);
    WaitUntil(clock_.Now() + kReapTimeout, wait);
  }
  for (const Worker& w : workers_) {
    if (w.exit) continue;
    log(absl::StrCat("warning: worker rank ", w.global_rank, " (pid ", w.child->pid(),
                     ") is still alive ", std::chrono::duration<double>(kReapTimeout).count(),
                     " s after SIGKILL (uninterruptible sleep?); giving up on it"));
  }
}

}  // namespace ddprun::agent
