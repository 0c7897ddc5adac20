// What the agent's main thread waits on: one queue of events (a signal, a
// child that changed state, an event of a Join stream), filled by the signal
// watcher and the rendezvous session's reader thread.
//
// The queue waits against an injected Clock: the real one blocks on a
// condition variable until the deadline; tests use a simulated queue that
// moves a FakeClock instead of sleeping (tests/support/agent_fakes.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

struct SignalEvent {
  int signo = 0;
};
struct ChildrenChanged {};
// An event of the Join stream with this id (see RendezvousSession::Join).
struct StreamEvent {
  std::uint64_t stream_id = 0;
  rendezvous::RoundEvent event;
};
using Event = std::variant<SignalEvent, ChildrenChanged, StreamEvent>;

// A multi-producer queue that one consumer waits on with a deadline.
class EventQueue {
 public:
  virtual ~EventQueue() = default;
  // Thread-safe.
  virtual void Push(Event e) = 0;
  // The next event, or nullopt once the clock reaches `deadline` (at once
  // when it already has).
  virtual std::optional<Event> PopUntil(rendezvous::TimePoint deadline) = 0;
};

// The real queue. `clock` must read std::chrono::steady_clock (SystemClock):
// the wait blocks on a condition variable until the deadline.
std::unique_ptr<EventQueue> MakeEventQueue(const rendezvous::Clock& clock);

// SIGINT, SIGTERM, SIGHUP, SIGQUIT: the signals that stop the node.
bool IsTerminatingSignal(int sig);
// "SIGTERM" (glibc's sigabbrev_np), "signal 42" when it has no name.
std::string SignalName(int sig);

// Blocks the signals the agent handles (SIGCHLD, SIGINT, SIGTERM, SIGHUP,
// SIGQUIT, SIGUSR1, SIGUSR2) in the calling thread; call first in main() so
// every later thread inherits the mask.
void BlockAgentSignals();

// A thread that turns the blocked signals into events (sigtimedwait):
// SIGCHLD -> ChildrenChanged, any other -> SignalEvent. Stops and joins in
// its destructor.
class SignalWatcher {
 public:
  explicit SignalWatcher(EventQueue& queue);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  void Run();
  EventQueue& queue_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ddprun::agent
