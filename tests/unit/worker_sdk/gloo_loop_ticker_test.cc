// [unit] LoopTicker (worker_sdk/src/gloo_loop_ticker.h) on a real Gloo TCP
// device (its epoll loop thread; no socket): the loop turns for it while a
// scope is alive, scopes nest across threads, and the ticker and the device
// may go in either order.
#include "gloo_loop_ticker.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "support/gloo_loopback.h"

using namespace std::chrono_literals;

using ::ddprun::test::LoopbackDevice;

namespace {

// Waits (at most 10 s) until the loop has called the ticker `n` more times.
bool TurnsBy(const ddp::detail::LoopTicker& ticker, std::uint64_t n) {
  const std::uint64_t from = ticker.turns();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ticker.turns() < from + n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("LoopTicker: the loop turns for it inside nested scopes from several threads", "[unit]") {
  auto device = LoopbackDevice();
  auto ticker = ddp::detail::LoopTicker::Attach(device);
  REQUIRE(ticker != nullptr);
  {
    ddp::detail::LoopTicker::Ticking outer(ticker.get());
    CHECK(TurnsBy(*ticker, 20));
    std::thread other([&] {
      ddp::detail::LoopTicker::Ticking inner(ticker.get());
      CHECK(TurnsBy(*ticker, 20));
    });
    other.join();
    // The inner scope's end leaves the outer one ticking.
    CHECK(TurnsBy(*ticker, 20));
  }
  // A new scope after the last one ended starts ticking again.
  ddp::detail::LoopTicker::Ticking again(ticker.get());
  CHECK(TurnsBy(*ticker, 20));
}

TEST_CASE("LoopTicker: the device may go first or last", "[unit]") {
  SECTION("device first (its loop joined while ticking), then the ticker") {
    auto device = LoopbackDevice();
    auto ticker = ddp::detail::LoopTicker::Attach(device);
    REQUIRE(ticker != nullptr);
    {
      ddp::detail::LoopTicker::Ticking ticking(ticker.get());
      device.reset();
    }
    ticker.reset();
  }
  SECTION("ticker first (it leaves the live loop), then the device") {
    auto device = LoopbackDevice();
    auto ticker = ddp::detail::LoopTicker::Attach(device);
    REQUIRE(ticker != nullptr);
    ticker.reset();
    device.reset();
  }
  SECTION("a null ticker's scope does nothing") {
    ddp::detail::LoopTicker::Ticking nothing(nullptr);
  }
}
