// Unit tests for KvEngine: data operations, waiters (satisfied, expired with a
// FakeClock, cancelled) and the size limits.
#include "ddprun/rendezvous/store/kv_engine.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {
namespace {

// Records every callback invocation of a waiter.
struct Recorder {
  std::vector<absl::Status> calls;
  KvEngine::WaitCallback Callback() {
    return [this](absl::Status st) { calls.push_back(std::move(st)); };
  }
};

TEST_CASE("KvEngine set, get, delete and count", "[unit]") {
  KvEngine engine;
  CHECK_FALSE(engine.Get("a").has_value());
  REQUIRE(engine.Set("a", "1").ok());
  REQUIRE(engine.Set("b", "").ok());
  CHECK(engine.Get("a") == std::optional<std::string>("1"));
  CHECK(engine.Get("b") == std::optional<std::string>(""));
  CHECK(engine.NumKeys() == 2);
  REQUIRE(engine.Set("a", "2").ok());
  CHECK(engine.Get("a") == std::optional<std::string>("2"));
  CHECK(engine.NumKeys() == 2);
  CHECK(engine.Check({"a", "b"}));
  CHECK_FALSE(engine.Check({"a", "c"}));
  CHECK(engine.Check({}));
  CHECK(engine.Delete("a"));
  CHECK_FALSE(engine.Delete("a"));
  CHECK_FALSE(engine.Get("a").has_value());
  CHECK(engine.NumKeys() == 1);
}

TEST_CASE("KvEngine Add starts at zero and stores decimal text", "[unit]") {
  KvEngine engine;
  auto r = engine.Add("n", 5);
  REQUIRE(r.ok());
  CHECK(*r == 5);
  r = engine.Add("n", -7);
  REQUIRE(r.ok());
  CHECK(*r == -2);
  CHECK(engine.Get("n") == std::optional<std::string>("-2"));

  REQUIRE(engine.Set("m", "40").ok());
  r = engine.Add("m", 2);
  REQUIRE(r.ok());
  CHECK(*r == 42);

  REQUIRE(engine.Set("text", "abc").ok());
  r = engine.Add("text", 1);
  REQUIRE(absl::IsInvalidArgument(r.status()));
  CHECK(r.status().message().find("not a decimal integer") != std::string::npos);
  CHECK(engine.Get("text") == std::optional<std::string>("abc"));

  REQUIRE(engine.Set("big", "9223372036854775807").ok());
  r = engine.Add("big", 1);
  CHECK(absl::IsOutOfRange(r.status()));
  CHECK(engine.Get("big") == std::optional<std::string>("9223372036854775807"));
}

TEST_CASE("KvEngine CompareSet", "[unit]") {
  KvEngine engine;
  SECTION("unset expected sets a missing key") {
    auto r = engine.CompareSet("k", std::nullopt, "v1");
    REQUIRE(r.ok());
    CHECK(r->swapped);
    CHECK(r->exists);
    CHECK(r->current == "v1");
    // ... and not an existing one.
    r = engine.CompareSet("k", std::nullopt, "v2");
    REQUIRE(r.ok());
    CHECK_FALSE(r->swapped);
    CHECK(r->current == "v1");
    CHECK(engine.Get("k") == std::optional<std::string>("v1"));
  }
  SECTION("a matching expected value swaps") {
    REQUIRE(engine.Set("k", "old").ok());
    auto r = engine.CompareSet("k", std::string("old"), "new");
    REQUIRE(r.ok());
    CHECK(r->swapped);
    CHECK(r->current == "new");
    CHECK(engine.Get("k") == std::optional<std::string>("new"));
  }
  SECTION("a mismatching expected value leaves the key") {
    REQUIRE(engine.Set("k", "old").ok());
    auto r = engine.CompareSet("k", std::string("other"), "new");
    REQUIRE(r.ok());
    CHECK_FALSE(r->swapped);
    CHECK(r->exists);
    CHECK(r->current == "old");
  }
  SECTION("an expected value does not match a missing key") {
    auto r = engine.CompareSet("k", std::string(""), "new");
    REQUIRE(r.ok());
    CHECK_FALSE(r->swapped);
    CHECK_FALSE(r->exists);
    CHECK(r->current.empty());
    CHECK_FALSE(engine.Get("k").has_value());
  }
}

TEST_CASE("KvEngine names the keys waited for that nobody has set", "[unit]") {
  KvEngine engine;
  const TimePoint far = TimePoint::max();
  Recorder r1, r2;
  engine.WaitAsync({"pg/rank_1", "pg/rank_0"}, far, r1.Callback());
  engine.WaitAsync({"pg/rank_1", "pg/rank_2"}, far, r2.Callback());
  CHECK(engine.WaitedKeys(16) == std::vector<std::string>{"pg/rank_0", "pg/rank_1", "pg/rank_2"});
  CHECK(engine.WaitedKeys(1) == std::vector<std::string>{"pg/rank_0"});
  REQUIRE(engine.Set("pg/rank_0", "x").ok());  // set: no longer missing
  CHECK(engine.WaitedKeys(16) == std::vector<std::string>{"pg/rank_1", "pg/rank_2"});
  engine.CancelAll(absl::CancelledError("gone"));
  CHECK(engine.WaitedKeys(16).empty());
}

TEST_CASE("KvEngine waiters are satisfied when every key exists", "[unit]") {
  KvEngine engine;
  const TimePoint far = TimePoint::max();

  SECTION("already present keys call back synchronously") {
    REQUIRE(engine.Set("a", "1").ok());
    Recorder rec;
    KvEngine::WaiterId id = engine.WaitAsync({"a"}, far, rec.Callback());
    CHECK(id == 0);
    REQUIRE(rec.calls.size() == 1);
    CHECK(rec.calls[0].ok());
    CHECK(engine.NumWaiters() == 0);
  }
  SECTION("a waiter on two keys fires once, after the second") {
    Recorder rec;
    KvEngine::WaiterId id = engine.WaitAsync({"a", "b"}, far, rec.Callback());
    CHECK(id != 0);
    CHECK(engine.NumWaiters() == 1);
    REQUIRE(engine.Set("a", "1").ok());
    CHECK(rec.calls.empty());
    REQUIRE(engine.Add("b", 1).ok());
    REQUIRE(rec.calls.size() == 1);
    CHECK(rec.calls[0].ok());
    CHECK(engine.NumWaiters() == 0);
    // Later sets do not call it again.
    REQUIRE(engine.Set("a", "2").ok());
    CHECK(rec.calls.size() == 1);
  }
  SECTION("a key deleted before the others appear is waited for again") {
    Recorder rec;
    engine.WaitAsync({"a", "b"}, far, rec.Callback());
    REQUIRE(engine.Set("a", "1").ok());
    CHECK(engine.Delete("a"));
    REQUIRE(engine.Set("b", "1").ok());
    CHECK(rec.calls.empty());
    REQUIRE(engine.Set("a", "again").ok());
    REQUIRE(rec.calls.size() == 1);
    CHECK(rec.calls[0].ok());
  }
  SECTION("CompareSet that creates the key satisfies waiters") {
    Recorder rec;
    engine.WaitAsync({"c"}, far, rec.Callback());
    REQUIRE(engine.CompareSet("c", std::nullopt, "x").ok());
    REQUIRE(rec.calls.size() == 1);
    CHECK(rec.calls[0].ok());
  }
  SECTION("duplicate keys in one wait are fine") {
    Recorder rec;
    engine.WaitAsync({"d", "d"}, far, rec.Callback());
    REQUIRE(engine.Set("d", "1").ok());
    REQUIRE(rec.calls.size() == 1);
    CHECK(rec.calls[0].ok());
  }
  SECTION("a callback may call back into the engine") {
    bool inner_ok = false;
    engine.WaitAsync({"e"}, far, [&](absl::Status st) {
      REQUIRE(st.ok());
      inner_ok = engine.Set("from-callback", "1").ok() && engine.Get("e").has_value();
    });
    REQUIRE(engine.Set("e", "1").ok());
    CHECK(inner_ok);
    CHECK(engine.Get("from-callback") == std::optional<std::string>("1"));
  }
}

TEST_CASE("KvEngine ExpireWaiters times out waiters past their deadline", "[unit]") {
  FakeClock clock;
  KvEngine engine;
  Recorder early, late;
  engine.WaitAsync({"x"}, clock.Now() + std::chrono::seconds(1), early.Callback());
  engine.WaitAsync({"y"}, clock.Now() + std::chrono::seconds(5), late.Callback());
  REQUIRE(engine.NextDeadline().has_value());
  CHECK(*engine.NextDeadline() == clock.Now() + std::chrono::seconds(1));

  engine.ExpireWaiters(clock.Now());
  CHECK(early.calls.empty());
  CHECK(late.calls.empty());

  clock.Advance(std::chrono::seconds(1));
  engine.ExpireWaiters(clock.Now());
  REQUIRE(early.calls.size() == 1);
  CHECK(absl::IsDeadlineExceeded(early.calls[0]));
  CHECK(early.calls[0].message().find("'x'") != std::string::npos);
  CHECK(late.calls.empty());
  CHECK(engine.NumWaiters() == 1);
  CHECK(*engine.NextDeadline() == clock.Now() + std::chrono::seconds(4));

  // A key set after expiry does not call the expired waiter again.
  REQUIRE(engine.Set("x", "1").ok());
  CHECK(early.calls.size() == 1);

  clock.Advance(std::chrono::seconds(10));
  engine.ExpireWaiters(clock.Now());
  REQUIRE(late.calls.size() == 1);
  CHECK(absl::IsDeadlineExceeded(late.calls[0]));
  CHECK(engine.NumWaiters() == 0);
  CHECK_FALSE(engine.NextDeadline().has_value());
}

TEST_CASE("KvEngine Cancel and CancelAll", "[unit]") {
  KvEngine engine;
  Recorder a, b, c;
  KvEngine::WaiterId ida = engine.WaitAsync({"a"}, TimePoint::max(), a.Callback());
  engine.WaitAsync({"b"}, TimePoint::max(), b.Callback());
  engine.WaitAsync({"c"}, TimePoint::max(), c.Callback());
  REQUIRE(engine.NumWaiters() == 3);

  engine.Cancel(ida, absl::CancelledError("test"));
  REQUIRE(a.calls.size() == 1);
  CHECK(absl::IsCancelled(a.calls[0]));
  engine.Cancel(ida, absl::CancelledError("again"));  // no-op
  CHECK(a.calls.size() == 1);
  REQUIRE(engine.Set("a", "1").ok());
  CHECK(a.calls.size() == 1);

  engine.CancelAll(absl::FailedPreconditionError("closed"));
  REQUIRE(b.calls.size() == 1);
  REQUIRE(c.calls.size() == 1);
  CHECK(absl::IsFailedPrecondition(b.calls[0]));
  CHECK(engine.NumWaiters() == 0);
}

TEST_CASE("KvEngine destructor cancels outstanding waiters", "[unit]") {
  Recorder rec;
  {
    KvEngine engine;
    engine.WaitAsync({"never"}, TimePoint::max(), rec.Callback());
  }
  REQUIRE(rec.calls.size() == 1);
  CHECK(absl::IsCancelled(rec.calls[0]));
}

TEST_CASE("KvEngine enforces key, value and engine size limits", "[unit]") {
  KvEngine engine;
  SECTION("keys") {
    const std::string long_key(kMaxKeyBytes + 1, 'k');
    absl::Status st = engine.Set(long_key, "v");
    CHECK(absl::IsInvalidArgument(st));
    CHECK(st.message().find("exceeds the limit of 4096 bytes") != std::string::npos);
    CHECK(engine.Set(std::string(kMaxKeyBytes, 'k'), "v").ok());
    CHECK(absl::IsInvalidArgument(KvEngine::CheckKey(long_key)));
    CHECK(absl::IsInvalidArgument(engine.Add(long_key, 1).status()));
  }
  SECTION("values") {
    absl::Status st = engine.Set("k", std::string(2 * kMaxValueBytes, 'v'));
    CHECK(absl::IsInvalidArgument(st));
    CHECK(std::string(st.message()) ==
          "store value of 2097152 bytes exceeds the limit of 1048576 bytes; store large data "
          "elsewhere and put its path in the store");
    CHECK(engine.Set("k", std::string(kMaxValueBytes, 'v')).ok());
    CHECK(absl::IsInvalidArgument(
        engine.CompareSet("k2", std::nullopt, std::string(kMaxValueBytes + 1, 'v')).status()));
  }
  SECTION("the whole engine") {
    const std::string value(kMaxValueBytes, 'v');
    std::size_t stored = 0;
    absl::Status st;
    for (int i = 0; i < 1000; ++i) {
      st = engine.Set("key" + std::to_string(i), value);
      if (!st.ok()) break;
      ++stored;
    }
    REQUIRE(absl::IsResourceExhausted(st));
    CHECK(st.message().find("268435456") != std::string::npos);
    CHECK(stored >= 255);
    CHECK(stored < 256);
    // Overwriting an existing key with a smaller value still works, and
    // deleting frees room.
    CHECK(engine.Set("key0", "small").ok());
    CHECK(engine.Set("another", value).ok());
    CHECK(engine.Delete("key1"));
    CHECK(engine.Set("yet-another", value).ok());
  }
  SECTION("queued items count against the engine's size") {
    const std::string value(kMaxValueBytes, 'v');
    absl::Status st;
    int pushed = 0;
    for (int i = 0; i < 1000; ++i) {
      st = engine.QueuePush("q", value);
      if (!st.ok()) break;
      ++pushed;
    }
    REQUIRE(absl::IsResourceExhausted(st));
    CHECK(st.message().find("pushing onto queue 'q'") != std::string::npos);
    CHECK(pushed == 255);
    CHECK(engine.QueueLength("q") == 255);
    CHECK(absl::IsResourceExhausted(engine.Set("k", value)));
    QueuePopResult popped = engine.QueuePop("q");  // a pop frees room
    CHECK(popped.length == 255);
    CHECK(popped.value == value);
    CHECK(engine.Set("k", value).ok());
    CHECK(engine.NumKeys() == 1);
    CHECK(engine.ListKeys() == std::vector<std::string>{"k"});
  }
  SECTION("waits on too many keys") {
    Recorder rec;
    std::vector<std::string> keys(kMaxWaitKeys + 1, "k");
    CHECK(engine.WaitAsync(keys, TimePoint::max(), rec.Callback()) == 0);
    REQUIRE(rec.calls.size() == 1);
    CHECK(absl::IsInvalidArgument(rec.calls[0]));
    CHECK(engine.NumWaiters() == 0);
  }
}

}  // namespace
}  // namespace ddprun::rendezvous
