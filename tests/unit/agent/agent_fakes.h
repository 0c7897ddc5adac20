// Fakes for the agent's unit tests: simulated time, scripted workers and an
// in-process rendezvous over the real round state machine. No sockets, no
// processes, no sleeps.
//
//   SimQueue         an EventQueue over a FakeClock: when it has no event
//                    before the deadline it runs the next timer or moves the
//                    clock to the deadline (discrete-event simulation);
//   FakeLauncher     scripted children that exit at a simulated time, or
//                    when signalled, and report it like SIGCHLD would;
//   InProcessSession a RendezvousSession over rendezvous::JobRendezvous (the
//                    daemon's state machine), ticked by the SimQueue.
#pragma once

#include <signal.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/events.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/job_rendezvous.h"

namespace ddprun::agent::testing {

using rendezvous::Duration;
using rendezvous::FakeClock;
using rendezvous::TimePoint;
using std::chrono::milliseconds;

class SimQueue final : public EventQueue {
 public:
  explicit SimQueue(FakeClock& clock) : clock_(clock) {}

  void Push(Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  // Runs `action` when simulated time reaches `t` (or at once if it has).
  void At(TimePoint t, std::function<void()> action) {
    std::lock_guard<std::mutex> lock(mu_);
    timers_.emplace(t, std::move(action));
  }
  void After(Duration d, std::function<void()> action) { At(clock_.Now() + d, std::move(action)); }

  std::optional<Event> PopUntil(TimePoint deadline) override {
    while (true) {
      std::function<void()> action;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!events_.empty()) {
          Event e = std::move(events_.front());
          events_.pop_front();
          return e;
        }
        auto it = timers_.begin();
        if (it == timers_.end() || it->first > deadline) {
          MoveTo(deadline);
          return std::nullopt;
        }
        MoveTo(it->first);
        action = std::move(it->second);
        timers_.erase(it);
      }
      action();
    }
  }

 private:
  void MoveTo(TimePoint t) {
    const TimePoint now = clock_.Now();
    if (t > now) clock_.Advance(t - now);
  }
  FakeClock& clock_;
  std::mutex mu_;
  std::deque<Event> events_;
  std::multimap<TimePoint, std::function<void()>> timers_;
};

// How one fake worker behaves.
struct Behaviour {
  std::optional<milliseconds> exit_after;  // nullopt: runs until signalled
  ExitStatus status;                       // how it exits on its own
  bool ignore_term = false;                // only SIGKILL ends it
};
inline Behaviour ExitsAfter(int ms, int code) {
  return Behaviour{milliseconds(ms), ExitStatus{code, 0}, false};
}
inline Behaviour Runs() { return Behaviour{}; }

// Everything the fake launcher saw.
struct Record {
  std::vector<SpawnSpec> spawns;
  std::vector<std::vector<int>> signals;  // per spawn index
  int launcher_closes = 0;                // ProcessLauncher::Close calls
};

// script(spawn_index, local_rank, restart_count) -> behaviour, or an error.
using Script = std::function<absl::StatusOr<Behaviour>(int, int, int)>;

class FakeChild final : public ChildProcess {
 public:
  FakeChild(int index, Behaviour b, Record& rec, FakeClock& clock, SimQueue& queue)
      : index_(index), b_(b), rec_(rec), clock_(clock), queue_(queue), start_(clock.Now()) {
    // The scripted exit wakes the agent like a SIGCHLD would.
    // (The timer outlives the child: it holds only the queue.)
    if (b_.exit_after) {
      queue_.At(start_ + *b_.exit_after, [q = &queue_] { q->Push(ChildrenChanged{}); });
    }
  }
  pid_t pid() const override { return 100000 + index_; }
  std::optional<ExitStatus> Poll() override {
    if (!exit_ && b_.exit_after && clock_.Now() - start_ >= *b_.exit_after) exit_ = b_.status;
    return exit_;
  }
  void SignalGroup(int sig) override {
    rec_.signals[index_].push_back(sig);
    if (exit_) return;
    const bool stops =
        sig == SIGKILL ||
        (!b_.ignore_term && (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT));
    if (stops) {
      exit_ = ExitStatus{0, sig};
      queue_.Push(ChildrenChanged{});
    }
  }

 private:
  const int index_;
  const Behaviour b_;
  Record& rec_;
  FakeClock& clock_;
  SimQueue& queue_;
  const TimePoint start_;
  std::optional<ExitStatus> exit_;
};

class FakeLauncher final : public ProcessLauncher {
 public:
  FakeLauncher(Script& script, Record& rec, FakeClock& clock, SimQueue& queue)
      : script_(script), rec_(rec), clock_(clock), queue_(queue) {}
  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) override {
    const int index = static_cast<int>(rec_.spawns.size());
    rec_.spawns.push_back(spec);
    rec_.signals.emplace_back();
    auto b = script_(index, std::stoi(spec.env.at("LOCAL_RANK")),
                     std::stoi(spec.env.at("TORCHELASTIC_RESTART_COUNT")));
    if (!b.ok()) return b.status();
    return std::unique_ptr<ChildProcess>(
        std::make_unique<FakeChild>(index, *b, rec_, clock_, queue_));
  }
  void Close() override { ++rec_.launcher_closes; }

 private:
  Script& script_;
  Record& rec_;
  FakeClock& clock_;
  SimQueue& queue_;
};

// A launcher that forwards to one that outlives the agent owning this one.
class LauncherRef final : public ProcessLauncher {
 public:
  explicit LauncherRef(ProcessLauncher& l) : l_(l) {}
  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) override {
    return l_.Spawn(spec);
  }
  void Close() override { l_.Close(); }

 private:
  ProcessLauncher& l_;
};

// The rendezvous as the embedded server runs it, in process: the real
// JobRendezvous, its deliveries to this agent's stream pushed on the queue,
// its deadlines run as SimQueue timers. Other nodes (Phantom*) are driven by
// the test directly; what is delivered to them is dropped.
class InProcessSession final : public RendezvousSession {
 public:
  InProcessSession(const std::string& job_id, FakeClock& clock, SimQueue& queue)
      : clock_(clock), queue_(queue), job_(job_id, clock) {}

  absl::Status Open(TimePoint, const std::function<bool()>&) override { return open_status; }
  absl::Status PrepareRound() override {
    ++master_port_;
    return absl::OkStatus();
  }
  int master_port() const override { return master_port_; }
  std::string endpoint() const override { return "127.0.0.1:29400"; }
  std::string advertised_host() const override { return "127.0.0.1"; }
  bool hosts_rendezvous() const override { return true; }

  std::uint64_t Join(const rendezvous::JoinSpec& spec, EventQueue& events) override {
    EndJoin();
    events_ = &events;
    stream_ = ++ids_;
    std::vector<rendezvous::Delivery> out;
    auto id = job_.Join(spec, &out);
    if (!id.ok()) {
      events.Push(StreamEvent{stream_, id.status()});
    } else {
      node_id_ = *id;
      open_ = true;
      Deliver(out);
    }
    ScheduleTick();
    return stream_;
  }
  void EndJoin() override {
    if (open_) {  // a stream cancelled before its end: the daemon sees a lost node
      open_ = false;
      std::vector<rendezvous::Delivery> out;
      job_.NodeLost(node_id_, &out);
      Deliver(out);
    }
  }
  absl::Status WaitForConnected(Duration) override { return absl::OkStatus(); }
  absl::Status Report(const rendezvous::Assignment& a, rendezvous::Outcome outcome,
                      const std::vector<rendezvous::WorkerFailure>& failures, Duration) override {
    reports.push_back(outcome);
    std::vector<rendezvous::Delivery> out;
    absl::Status st = job_.Report(a.node_id, a.round, outcome, failures, &out);
    Deliver(out);
    ScheduleTick();
    return st;
  }
  absl::StatusOr<rendezvous::JobStatus> JobStatus(Duration) override { return job_.Status(); }
  void Leave() override {
    ++leaves;
    EndJoin();
  }
  void Close() override { EndJoin(); }
  void WorkersStarted() override { workers_started.push_back(clock_.Now()); }
  int leaves = 0;                          // Leave() calls
  std::vector<TimePoint> workers_started;  // when WorkersStarted() was called

  // Another node of the job, joined by the test; returns its node id.
  std::string PhantomJoin(const AgentOptions& o, const std::string& host) {
    rendezvous::JoinSpec spec;
    spec.job_id = o.job_id;
    spec.host = host;
    spec.pid = 1;
    spec.nproc = o.nproc_per_node;
    spec.min_nodes = o.min_nodes;
    spec.max_nodes = o.max_nodes;
    spec.policy.max_restarts = o.policy.max_restarts;
    spec.policy.join_timeout_s = o.policy.join_timeout_s;
    spec.policy.last_call_timeout_s = o.policy.last_call_timeout_s;
    spec.policy.restart_policy = o.policy.restart_policy;
    spec.command = absl::StrJoin(o.command, " ");
    std::vector<rendezvous::Delivery> out;
    auto id = job_.Join(spec, &out);
    Deliver(out);
    ScheduleTick();
    return id.ok() ? *id : "";
  }
  void PhantomLost(const std::string& node_id) {
    std::vector<rendezvous::Delivery> out;
    job_.NodeLost(node_id, &out);
    Deliver(out);
    ScheduleTick();
  }

  absl::StatusOr<std::string> OpenSdkStore(const rendezvous::Assignment& a) override {
    if (sdk_store) return sdk_store(a);
    return std::string();
  }

  absl::Status open_status;
  std::vector<rendezvous::Outcome> reports;
  // OpenSdkStore's answer for a round (unset: "", the gRPC Store).
  std::function<absl::StatusOr<std::string>(const rendezvous::Assignment&)> sdk_store;

 private:
  void Deliver(const std::vector<rendezvous::Delivery>& out) {
    for (const auto& d : out) {
      if (!open_ || d.node_id != node_id_ || events_ == nullptr) continue;
      if (!std::holds_alternative<rendezvous::Assignment>(d.event)) open_ = false;
      events_->Push(StreamEvent{stream_, d.event});
    }
  }
  // The daemon's timer: a Tick at the job's next deadline.
  void ScheduleTick(bool from_tick = false) {
    auto t = job_.NextDeadline();
    if (!t || (from_tick && *t <= clock_.Now())) return;
    queue_.At(*t, [this] {
      std::vector<rendezvous::Delivery> out;
      job_.Tick(&out);
      Deliver(out);
      ScheduleTick(/*from_tick=*/true);
    });
  }

  FakeClock& clock_;
  SimQueue& queue_;
  rendezvous::JobRendezvous job_;
  EventQueue* events_ = nullptr;
  std::uint64_t ids_ = 0;
  std::uint64_t stream_ = 0;
  std::string node_id_;
  bool open_ = false;
  int master_port_ = 40000;
};

// One simulated node: clock, queue, launcher (and the record of what it
// saw). Members are referenced by the fakes, so a SimWorld does not move.
struct SimWorld {
  FakeClock clock;
  SimQueue queue{clock};
  Record rec;
  Script script = [](int, int, int) -> absl::StatusOr<Behaviour> { return Runs(); };
  FakeLauncher launcher{script, rec, clock, queue};
};

}  // namespace ddprun::agent::testing
