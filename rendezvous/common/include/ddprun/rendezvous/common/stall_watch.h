// Notices its own process stalled: stopped (SIGSTOP, a debugger), swapped
// out or starved of CPU. While ddprund is stalled nothing answers its agents'
// keepalive pings, so an agent may drop its Join stream because of ddprund,
// not because the agent is gone; the daemon then holds that node's seat for
// it to re-attach (docs/ha.md, "A stalled ddprund") instead of counting it
// lost at once.
//
// A thread wakes every kStallTick of real time (steady_clock, never an
// injected clock: a stall is the process', not the table's) and measures how
// late it woke. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace ddprun::rendezvous {

// The watch's period.
inline constexpr std::chrono::milliseconds kStallTick{50};
// A wake-up this late is a stall: half the shortest keepalive answer any
// agent allows (500 ms, agents listing replicas, rendezvous/src/client.cc),
// so every stall that can make an agent drop its stream is one.
inline constexpr std::chrono::milliseconds kStallThreshold{250};
// Streams the server finds broken up to this long after a stall ended still
// count as broken by it: the agents dropped them during the stall, and the
// server reads the news from its backlog once it runs again.
inline constexpr std::chrono::seconds kStallAftermath{2};

class StallWatch {
 public:
  // on_stall(length) runs on the watch's thread after each stall it noticed
  // (may be empty); it must not block.
  explicit StallWatch(std::function<void(std::chrono::steady_clock::duration)> on_stall = {});
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;
  ~StallWatch();  // joins the thread

  // Whether the process is stalled now (the watch is overdue: a caller that
  // runs first after a SIGCONT sees it before the watch wakes) or a stall
  // ended less than kStallAftermath ago.
  bool StalledRecently() const;

 private:
  void Run();

  const std::function<void(std::chrono::steady_clock::duration)> on_stall_;
  // steady_clock ticks (ns since its epoch) of the last wake-up and of the
  // end of the last stall (0: none yet).
  std::atomic<std::int64_t> last_wake_;
  std::atomic<std::int64_t> stall_end_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::rendezvous
