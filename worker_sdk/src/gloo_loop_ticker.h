// Keeps Gloo's TCP device loop turning while a group connects or closes.
//
// The loop of this Gloo (libgloo 0.0~git20220518) waits in epoll_wait with a
// 10 ms timeout, and a thread that takes a socket out of it (a pair's connect
// on the connecting side, Pair::setSync, closing a connected async pair,
// destroying the device) blocks until the loop's next turn: up to 10 ms each,
// and each group has several of them in a row (docs/benchmarks.md, "SDK:
// re-forming over TCP": they were most of a 100 ms re-form). LoopTicker
// registers an eventfd with the device's loop; while a Ticking scope is alive
// a thread writes it every kTick, so the loop turns at least that often and
// those waits last a tick instead of up to 10 ms. Outside a scope nothing
// runs: the loop keeps Gloo's own 10 ms timeout and costs nothing more.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "gloo/transport/device.h"
#include "gloo/transport/tcp/loop.h"

namespace ddp::detail {

class LoopTicker final : private gloo::transport::tcp::Handler {
 public:
  // How often the loop turns inside a Ticking scope.
  static constexpr std::chrono::microseconds kTick{100};

  // Registers with `device`'s loop (a gloo TCP device); null when the device
  // is of another transport or no eventfd can be made (then scopes do
  // nothing and Gloo's waits stay as they are).
  static std::unique_ptr<LoopTicker> Attach(const std::shared_ptr<gloo::transport::Device>& device);
  // Must outlive every turn of the loop that may call it: when the device is
  // already gone (its loop joined) it only closes the eventfd, else it takes
  // it out of the loop first (one of the waits above).
  ~LoopTicker() override;
  LoopTicker(const LoopTicker&) = delete;
  LoopTicker& operator=(const LoopTicker&) = delete;

  // How many times the loop has called this ticker (a turn it caused), for
  // its unit test.
  std::uint64_t turns() const { return turns_.load(); }

  // While alive, the loop turns every kTick. Scopes may nest and overlap
  // (from several threads); the thread runs while any is alive.
  class Ticking {
   public:
    explicit Ticking(LoopTicker* ticker);  // null: does nothing
    ~Ticking();
    Ticking(const Ticking&) = delete;
    Ticking& operator=(const Ticking&) = delete;

   private:
    LoopTicker* ticker_;
  };

 private:
  LoopTicker(std::weak_ptr<gloo::transport::Device> device, int fd);
  void handleEvents(int events) override;  // on the loop's thread: drains the eventfd
  void Enter();
  void Leave();

  std::weak_ptr<gloo::transport::Device> device_;
  const int fd_;
  std::atomic<std::uint64_t> turns_{0};
  std::mutex mu_;  // the fields below
  int scopes_ = 0;
  std::shared_ptr<std::atomic<bool>> stop_;  // the running thread's stop flag
  std::thread thread_;
};

}  // namespace ddp::detail
