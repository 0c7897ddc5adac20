// [unit] tests of the communication thread's queue (comm_queue.h): issue
// order, and the caller's claim (TryClaim/Release) that lets it run a small
// collective itself. One thread of this process; no sockets, no processes.
#include "comm_queue.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using ddp::detail::CommQueue;
using ddp::detail::QueuedTask;
using ddp::detail::QueuedWork;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<QueuedWork> NewWork() {
  return std::make_shared<QueuedWork>(std::weak_ptr<ddp::detail::Backend>(), "op", 10s);
}

}  // namespace

TEST_CASE("comm queue: a claim holds queued work back; a released remainder runs first", "[unit]") {
  CommQueue q;
  CHECK_FALSE(q.TryClaim());  // not started: nothing to claim against
  q.Start([](const std::string&, std::exception_ptr) { return absl::OkStatus(); }, nullptr);
  std::mutex mu;
  std::vector<std::string> ran;
  auto log = [&](std::string what) {
    return [&, what] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(what);
    };
  };
  REQUIRE(q.TryClaim());
  CHECK_FALSE(q.TryClaim());  // one claim at a time
  // Issued by another thread while the caller holds the claim: it waits.
  auto later = NewWork();
  q.Push("later", log("later"), later);
  CHECK(later->IsCompleted().value() == false);
  auto rest = NewWork();
  q.Release(QueuedTask{"rest", log("rest"), rest});
  REQUIRE(rest->Wait(10s).ok());
  REQUIRE(later->Wait(10s).ok());
  CHECK(ran == std::vector<std::string>{"rest", "later"});
  // Idle again: a claim released with nothing left.
  REQUIRE(q.TryClaim());
  q.Release();
  auto last = NewWork();
  q.Push("last", log("last"), last);
  REQUIRE(last->Wait(10s).ok());
  q.Stop(false);
  CHECK_FALSE(q.TryClaim());
}
