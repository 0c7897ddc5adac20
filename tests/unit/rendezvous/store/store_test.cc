// Unit tests for InMemoryStore and PrefixStore (no sockets, short timeouts).
#include "ddprun/rendezvous/store/store.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

namespace ddprun::rendezvous {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

TEST_CASE("InMemoryStore basic operations", "[unit]") {
  InMemoryStore store;
  REQUIRE(store.Set("a", "1").ok());
  auto v = store.Get("a", milliseconds(50));
  REQUIRE(v.ok());
  CHECK(*v == "1");

  auto n = store.Add("n", 3);
  REQUIRE(n.ok());
  CHECK(*n == 3);
  n = store.Add("n", 4);
  REQUIRE(n.ok());
  CHECK(*n == 7);
  v = store.Get("n", milliseconds(50));
  REQUIRE(v.ok());
  CHECK(*v == "7");

  std::string current;
  auto swapped = store.CompareSet("c", std::nullopt, "first", &current);
  REQUIRE(swapped.ok());
  CHECK(*swapped);
  CHECK(current == "first");
  swapped = store.CompareSet("c", std::string("wrong"), "second", &current);
  REQUIRE(swapped.ok());
  CHECK_FALSE(*swapped);
  CHECK(current == "first");
  swapped = store.CompareSet("c", std::string("first"), "second", nullptr);
  REQUIRE(swapped.ok());
  CHECK(*swapped);

  auto deleted = store.Delete("a");
  REQUIRE(deleted.ok());
  CHECK(*deleted);
  deleted = store.Delete("a");
  REQUIRE(deleted.ok());
  CHECK_FALSE(*deleted);

  auto many = store.MultiGet({"n", "c"}, milliseconds(50));
  REQUIRE(many.ok());
  CHECK(*many == std::vector<std::string>{"7", "second"});

  CHECK(absl::IsInvalidArgument(store.Set("big", std::string(2 << 20, 'x'))));
}

TEST_CASE("InMemoryStore waits time out with DeadlineExceeded", "[unit]") {
  InMemoryStore store;
  const auto start = SteadyClock::now();
  auto v = store.Get("missing", milliseconds(50));
  const auto elapsed = SteadyClock::now() - start;
  REQUIRE(absl::IsDeadlineExceeded(v.status()));
  CHECK(v.status().message().find("'missing'") != std::string::npos);
  CHECK(elapsed >= milliseconds(50));
  CHECK(elapsed < milliseconds(2000));

  REQUIRE(store.Set("present", "x").ok());
  absl::Status st = store.Wait({"present", "absent"}, milliseconds(50));
  CHECK(absl::IsDeadlineExceeded(st));
  CHECK(st.message().find("'absent'") != std::string::npos);
  CHECK(absl::IsDeadlineExceeded(store.MultiGet({"present", "absent"}, milliseconds(50)).status()));

  // A zero timeout checks once without blocking.
  CHECK(store.Wait({"present"}, Duration::zero()).ok());
  CHECK(absl::IsDeadlineExceeded(store.Wait({"absent"}, Duration::zero())));

  // A timed-out wait leaves nothing behind: a later set is unaffected and a
  // new wait succeeds.
  REQUIRE(store.Set("absent", "now").ok());
  CHECK(store.Wait({"present", "absent"}, milliseconds(50)).ok());
}

TEST_CASE("InMemoryStore wakes a waiter when another thread sets the key", "[unit]") {
  InMemoryStore store;
  // Catch2 assertions are not thread-safe: threads record, the test asserts.
  absl::Status set_status;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    set_status = store.Set("late", "value");
  });
  const auto start = SteadyClock::now();
  auto v = store.Get("late", std::chrono::seconds(10));
  const auto elapsed = SteadyClock::now() - start;
  setter.join();
  REQUIRE(set_status.ok());
  REQUIRE(v.ok());
  CHECK(*v == "value");
  CHECK(elapsed < std::chrono::seconds(5));

  bool adds_ok = false;
  std::thread adder([&] {
    std::this_thread::sleep_for(milliseconds(20));
    const bool first = store.Add("k1", 1).ok();
    std::this_thread::sleep_for(milliseconds(20));
    adds_ok = first && store.Add("k2", 1).ok();
  });
  absl::Status waited = store.Wait({"k1", "k2"}, std::chrono::seconds(10));
  adder.join();
  CHECK(adds_ok);
  CHECK(waited.ok());
}

TEST_CASE("PrefixStore namespaces keys of the base store", "[unit]") {
  auto base = std::make_shared<InMemoryStore>();
  PrefixStore a("/worker/attempt_0", base);
  PrefixStore b("/worker/attempt_1", base);

  REQUIRE(a.Set("k", "from-a").ok());
  REQUIRE(b.Set("k", "from-b").ok());
  auto v = base->Get("/worker/attempt_0/k", milliseconds(50));
  REQUIRE(v.ok());
  CHECK(*v == "from-a");
  v = b.Get("k", milliseconds(50));
  REQUIRE(v.ok());
  CHECK(*v == "from-b");

  auto n = a.Add("count", 2);
  REQUIRE(n.ok());
  CHECK(*n == 2);
  CHECK(*base->Get("/worker/attempt_0/count", milliseconds(50)) == "2");
  CHECK(absl::IsDeadlineExceeded(b.Get("count", milliseconds(50)).status()));

  std::string current;
  auto swapped = a.CompareSet("cas", std::nullopt, "x", &current);
  REQUIRE(swapped.ok());
  CHECK(*swapped);
  CHECK(*base->Get("/worker/attempt_0/cas", milliseconds(50)) == "x");

  CHECK(a.Wait({"k", "count"}, milliseconds(50)).ok());
  CHECK(absl::IsDeadlineExceeded(b.Wait({"k", "count"}, milliseconds(50))));

  auto many = a.MultiGet({"k", "count"}, milliseconds(50));
  REQUIRE(many.ok());
  CHECK(*many == std::vector<std::string>{"from-a", "2"});

  auto deleted = a.Delete("k");
  REQUIRE(deleted.ok());
  CHECK(*deleted);
  CHECK(absl::IsDeadlineExceeded(base->Get("/worker/attempt_0/k", milliseconds(10)).status()));
  CHECK(*base->Get("/worker/attempt_1/k", milliseconds(10)) == "from-b");

  // Prefixes nest.
  auto inner = std::make_shared<PrefixStore>("/worker", base);
  PrefixStore nested("attempt_0", inner);
  CHECK(*nested.Get("count", milliseconds(50)) == "2");
}

}  // namespace
}  // namespace ddprun::rendezvous
