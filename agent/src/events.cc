#include "ddprun/agent/events.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

#include <chrono>

namespace ddprun::agent {
namespace {

constexpr int kAgentSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
// How often the signal watcher checks its stop flag.
constexpr auto kSignalWaitSlice = std::chrono::milliseconds(100);

sigset_t AgentSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kAgentSignals) sigaddset(&set, s);
  return set;
}

class CondVarQueue final : public EventQueue {
 public:
  explicit CondVarQueue(const rendezvous::Clock& clock) : clock_(clock) {}
  void Push(Event e) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  std::optional<Event> PopUntil(rendezvous::TimePoint deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    while (events_.empty()) {
      if (clock_.Now() >= deadline) return std::nullopt;
      cv_.wait_until(lock, deadline);
    }
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  const rendezvous::Clock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

}  // namespace

std::unique_ptr<EventQueue> MakeEventQueue(const rendezvous::Clock& clock) {
  return std::make_unique<CondVarQueue>(clock);
}

bool IsTerminatingSignal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

std::string SignalName(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

void BlockAgentSignals() {
  sigset_t set = AgentSignalSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SignalWatcher::SignalWatcher(EventQueue& queue) : queue_(queue) {
  thread_ = std::thread([this] { Run(); });
}

SignalWatcher::~SignalWatcher() {
  stop_ = true;
  // Wake the watcher now rather than at the end of its slice.
  ::pthread_kill(thread_.native_handle(), SIGCHLD);
  thread_.join();
}

void SignalWatcher::Run() {
  const sigset_t set = AgentSignalSet();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kSignalWaitSlice);
  const struct timespec slice { 0, static_cast<long>(ns.count()) };
  while (!stop_.load()) {
    siginfo_t info;
    int sig = ::sigtimedwait(&set, &info, &slice);
    if (sig < 0) continue;  // EAGAIN (slice over) or EINTR
    if (sig == SIGCHLD) {
      queue_.Push(ChildrenChanged{});
    } else {
      queue_.Push(SignalEvent{sig});
    }
  }
}

}  // namespace ddprun::agent
