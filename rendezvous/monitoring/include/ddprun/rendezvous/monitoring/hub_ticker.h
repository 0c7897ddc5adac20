// The metrics hub's clock: a thread that calls MetricsHub::Tick() once a second
// (series points, hang deadlines), shared by ddprund's server and the
// rendezvous that ddprun runs in process.
#ifndef DDPRUN_RENDEZVOUS_HUB_TICKER_H_
#define DDPRUN_RENDEZVOUS_HUB_TICKER_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

// Ticks `hub` from construction until Stop() or destruction; Stop() returns
// once the thread has ended (at most one Tick() in progress is waited for).
// `hub` must outlive the ticker.
class HubTicker {
 public:
  explicit HubTicker(MetricsHub* hub) : thread_([this, hub] { Loop(hub); }) {}
  HubTicker(const HubTicker&) = delete;
  HubTicker& operator=(const HubTicker&) = delete;
  ~HubTicker() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop(MetricsHub* hub) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      hub->Tick();
      lock.lock();
      cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_; });
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace ddprun::rendezvous

#endif  // DDPRUN_RENDEZVOUS_HUB_TICKER_H_
