// InMemoryStore (a Store over an in-process KvEngine) and PrefixStore.
//
// Blocking waits are built on KvEngine::WaitAsync: the caller sleeps on its own
// condition variable for the timeout and cancels the engine waiter if it is
// still pending then. The engine never needs ExpireWaiters for these waits.
#include "ddprun/rendezvous/store/store.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {
namespace {

std::string DescribeKeys(const std::vector<std::string>& keys) {
  constexpr std::size_t kMaxShown = 4;
  std::vector<std::string> shown;
  for (std::size_t i = 0; i < keys.size() && i < kMaxShown; ++i) {
    shown.push_back("'" + keys[i] + "'");
  }
  std::string out = absl::StrJoin(shown, ", ");
  if (keys.size() > kMaxShown) absl::StrAppend(&out, ", ... (", keys.size(), " keys)");
  return out;
}

double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

absl::Status WaitTimeout(const std::vector<std::string>& keys, Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "timed out after ", ToSeconds(timeout), "s waiting for store keys [", DescribeKeys(keys),
      "]; the process that should set them may have failed or not started yet"));
}

// Waits up to `timeout` for every key to exist in `engine`.
absl::Status WaitOn(KvEngine& engine, const std::vector<std::string>& keys, Duration timeout) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
  };
  auto state = std::make_shared<State>();
  KvEngine::WaiterId id = engine.WaitAsync(keys, TimePoint::max(), [state](absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->done) return;
      state->done = true;
      state->status = std::move(status);
    }
    state->cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(state->mu);
    if (timeout > Duration::zero()) {
      state->cv.wait_for(lock, timeout, [&] { return state->done; });
    }
    if (state->done) return state->status;
  }
  // Still pending: cancel. The callback runs now unless the keys appeared in
  // between, in which case it already ran with OK and that result stands.
  engine.Cancel(id, WaitTimeout(keys, timeout));
  std::lock_guard<std::mutex> lock(state->mu);
  return state->done ? state->status : WaitTimeout(keys, timeout);
}

}  // namespace

// ---------------------------------------------------------------------------
// InMemoryStore

InMemoryStore::InMemoryStore() : engine_(std::make_unique<KvEngine>()) {}
InMemoryStore::~InMemoryStore() = default;

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  return engine_->Set(key, value);
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (std::optional<std::string> value = engine_->Get(key)) return *std::move(value);
    const Duration left = deadline - std::chrono::steady_clock::now();
    if (left <= Duration::zero()) return WaitTimeout({key}, timeout);
    // The key may be deleted again between the wait and the read: loop.
    absl::Status st = WaitOn(*engine_, {key}, left);
    if (absl::IsDeadlineExceeded(st)) return WaitTimeout({key}, timeout);
    DDPRUN_RETURN_IF_ERROR(st);
  }
}

absl::StatusOr<std::int64_t> InMemoryStore::Add(const std::string& key, std::int64_t delta) {
  return engine_->Add(key, delta);
}

absl::StatusOr<bool> InMemoryStore::CompareSet(const std::string& key,
                                               const std::optional<std::string>& expected,
                                               const std::string& desired, std::string* current) {
  DDPRUN_ASSIGN_OR_RETURN(CompareSetResult result, engine_->CompareSet(key, expected, desired));
  if (current != nullptr) *current = std::move(result.current);
  return result.swapped;
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  return WaitOn(*engine_, keys, timeout);
}

absl::StatusOr<bool> InMemoryStore::Delete(const std::string& key) { return engine_->Delete(key); }

absl::StatusOr<std::vector<std::string>> InMemoryStore::MultiGet(
    const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      std::optional<std::string> value = engine_->Get(key);
      if (!value) break;
      values.push_back(*std::move(value));
    }
    if (values.size() == keys.size()) return values;
    const Duration left = deadline - std::chrono::steady_clock::now();
    if (left <= Duration::zero()) return WaitTimeout(keys, timeout);
    absl::Status st = WaitOn(*engine_, keys, left);
    if (absl::IsDeadlineExceeded(st)) return WaitTimeout(keys, timeout);
    DDPRUN_RETURN_IF_ERROR(st);
  }
}

// ---------------------------------------------------------------------------
// PrefixStore

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {}

std::vector<std::string> PrefixStore::Keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(Key(key));
  return out;
}

absl::Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(Key(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(const std::string& key, Duration timeout) {
  return base_->Get(Key(key), timeout);
}

absl::StatusOr<std::int64_t> PrefixStore::Add(const std::string& key, std::int64_t delta) {
  return base_->Add(Key(key), delta);
}

absl::StatusOr<bool> PrefixStore::CompareSet(const std::string& key,
                                             const std::optional<std::string>& expected,
                                             const std::string& desired, std::string* current) {
  return base_->CompareSet(Key(key), expected, desired, current);
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  return base_->Wait(Keys(keys), timeout);
}

absl::StatusOr<bool> PrefixStore::Delete(const std::string& key) { return base_->Delete(Key(key)); }

absl::StatusOr<std::vector<std::string>> PrefixStore::MultiGet(const std::vector<std::string>& keys,
                                                               Duration timeout) {
  return base_->MultiGet(Keys(keys), timeout);
}

}  // namespace ddprun::rendezvous
