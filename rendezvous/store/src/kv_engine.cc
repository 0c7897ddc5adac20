// KvEngine: a mutex-protected map plus a table of asynchronous waiters.
//
// Invariants (under mu_):
//   bytes_ == sum over data_ of key.size() + value.size(), plus, for every
//   queued item, its queue's name.size() + item.size().
//   No queue in queues_ is empty.
//   Every waiter in waiters_ has one by_key_ entry per key it waits on, and
//   at least one of its keys is absent (otherwise it would have fired).
// Callbacks are moved out of waiters_ under the lock and invoked after it is
// released, so a callback may call back into the engine.
#include "ddprun/rendezvous/store/kv_engine.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

// Runs callbacks with a status; used after the lock is released.
void RunAll(std::vector<KvEngine::WaitCallback>& cbs, const absl::Status& status) {
  for (auto& cb : cbs) {
    if (cb) cb(status);
  }
}

// Parses a whole string as a decimal int64 (an optional sign, then digits).
std::optional<std::int64_t> ParseInt64(const std::string& s) {
  if (s.empty()) return std::nullopt;
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  if (*begin == '+') ++begin;  // std::from_chars rejects a leading '+'.
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// A short, printable rendering of a value for error messages.
std::string Preview(const std::string& value) {
  constexpr std::size_t kMax = 32;
  std::string out;
  for (char c : value.substr(0, kMax)) {
    out.push_back((c >= 0x20 && c < 0x7f) ? c : '?');
  }
  if (value.size() > kMax) out += "...";
  return out;
}

absl::Status CheckValue(const std::string& value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store value of ", value.size(), " bytes exceeds the limit of ", kMaxValueBytes,
        " bytes; store large data elsewhere and put its path in the store"));
  }
  return absl::OkStatus();
}

}  // namespace

KvEngine::~KvEngine() { CancelAll(absl::CancelledError("the store was shut down")); }

absl::Status KvEngine::CheckKey(const std::string& key) {
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key of ", key.size(),
                                                   " bytes exceeds the limit of ", kMaxKeyBytes,
                                                   " bytes; use a shorter key"));
  }
  return absl::OkStatus();
}

absl::Status KvEngine::PutLocked(std::unordered_map<std::string, std::string>::iterator it,
                                 const std::string& key, std::string value,
                                 std::vector<WaitCallback>* ready) {
  const std::size_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  const std::size_t new_bytes = key.size() + value.size();
  if (bytes_ - old_bytes + new_bytes > kMaxEngineBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the store holds ", bytes_, " bytes and writing key '", Preview(key),
        "' would exceed the limit of ", kMaxEngineBytes,
        " bytes; delete keys that are no longer needed or store large data elsewhere"));
  }
  bytes_ = bytes_ - old_bytes + new_bytes;
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  CollectReadyLocked(key, ready);
  return absl::OkStatus();
}

absl::Status KvEngine::Set(const std::string& key, std::string value) {
  DDPRUN_RETURN_IF_ERROR(CheckKey(key));
  DDPRUN_RETURN_IF_ERROR(CheckValue(value));
  std::vector<WaitCallback> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DDPRUN_RETURN_IF_ERROR(PutLocked(data_.find(key), key, std::move(value), &ready));
  }
  RunAll(ready, absl::OkStatus());
  return absl::OkStatus();
}

std::optional<std::string> KvEngine::Get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::int64_t> KvEngine::Add(const std::string& key, std::int64_t delta) {
  DDPRUN_RETURN_IF_ERROR(CheckKey(key));
  std::vector<WaitCallback> ready;
  std::int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    std::int64_t current = 0;
    if (it != data_.end()) {
      std::optional<std::int64_t> parsed = ParseInt64(it->second);
      if (!parsed) {
        return absl::InvalidArgumentError(
            absl::StrCat("store key '", Preview(key), "' holds '", Preview(it->second),
                         "', not a decimal integer; Add only works on counter keys"));
      }
      current = *parsed;
    }
    if ((delta > 0 && current > std::numeric_limits<std::int64_t>::max() - delta) ||
        (delta < 0 && current < std::numeric_limits<std::int64_t>::min() - delta)) {
      return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to store key '", Preview(key),
                                                "' (", current,
                                                ") overflows int64; reset the counter"));
    }
    result = current + delta;
    DDPRUN_RETURN_IF_ERROR(PutLocked(it, key, std::to_string(result), &ready));
  }
  RunAll(ready, absl::OkStatus());
  return result;
}

absl::StatusOr<CompareSetResult> KvEngine::CompareSet(const std::string& key,
                                                      const std::optional<std::string>& expected,
                                                      std::string desired) {
  DDPRUN_RETURN_IF_ERROR(CheckKey(key));
  DDPRUN_RETURN_IF_ERROR(CheckValue(desired));
  std::vector<WaitCallback> ready;
  CompareSetResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    const bool matches =
        expected.has_value() ? (it != data_.end() && it->second == *expected) : it == data_.end();
    if (!matches) {
      result.swapped = false;
      result.exists = it != data_.end();
      if (result.exists) result.current = it->second;
      return result;
    }
    result.current = desired;
    DDPRUN_RETURN_IF_ERROR(PutLocked(it, key, std::move(desired), &ready));
    result.swapped = true;
    result.exists = true;
  }
  RunAll(ready, absl::OkStatus());
  return result;
}

bool KvEngine::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  bytes_ -= key.size() + it->second.size();
  data_.erase(it);
  return true;
}

std::size_t KvEngine::NumKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

std::vector<std::string> KvEngine::ListKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  keys.reserve(data_.size());
  for (const auto& [key, value] : data_) keys.push_back(key);
  return keys;
}

absl::Status KvEngine::QueuePush(const std::string& name, std::string value) {
  DDPRUN_RETURN_IF_ERROR(CheckKey(name));
  DDPRUN_RETURN_IF_ERROR(CheckValue(value));
  std::vector<WaitCallback> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::size_t item_bytes = name.size() + value.size();
    if (bytes_ + item_bytes > kMaxEngineBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the store holds ", bytes_, " bytes and pushing onto queue '", Preview(name),
          "' would exceed the limit of ", kMaxEngineBytes, " bytes; pop or delete what is done"));
    }
    bytes_ += item_bytes;
    queues_[name].push_back(std::move(value));
    CollectReadyLocked(name, &ready, 1);
  }
  RunAll(ready, absl::OkStatus());
  return absl::OkStatus();
}

QueuePopResult KvEngine::QueuePop(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  QueuePopResult result;
  auto it = queues_.find(name);
  if (it == queues_.end()) return result;
  result.length = static_cast<std::int64_t>(it->second.size());
  bytes_ -= name.size() + it->second.front().size();
  result.value = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return result;
}

std::int64_t KvEngine::QueueLength(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(name);
  return it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
}

std::vector<std::pair<std::string, std::string>> KvEngine::Dump() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {data_.begin(), data_.end()};
}

bool KvEngine::Check(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  return HasAllLocked(keys);
}

KvEngine::WaiterId KvEngine::WaitAsync(std::vector<std::string> keys, TimePoint deadline,
                                       WaitCallback cb) {
  absl::Status invalid;
  if (keys.size() > kMaxWaitKeys) {
    invalid = absl::InvalidArgumentError(absl::StrCat("a wait on ", keys.size(),
                                                      " store keys exceeds the limit of ",
                                                      kMaxWaitKeys, "; wait on fewer keys"));
  }
  for (const std::string& key : keys) {
    if (!invalid.ok()) break;
    invalid = CheckKey(key);
  }
  if (!invalid.ok()) {
    if (cb) cb(invalid);
    return 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!HasAllLocked(keys)) {
      const WaiterId id = next_id_++;
      // One index entry per distinct key: a later Set of any of them re-checks the waiter
      // (a key present now may be deleted before the others appear).
      std::vector<std::string> distinct = keys;
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      for (const std::string& key : distinct) by_key_[key].insert(id);
      waiters_.emplace(id, Waiter{std::move(distinct), deadline, std::move(cb)});
      return id;
    }
  }
  if (cb) cb(absl::OkStatus());
  return 0;
}

void KvEngine::Cancel(WaiterId id, absl::Status why) {
  WaitCallback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    UnindexLocked(id, it->second.keys);
    cb = std::move(it->second.cb);
    waiters_.erase(it);
  }
  if (cb) cb(why);
}

void KvEngine::CancelAll(absl::Status why) {
  std::vector<WaitCallback> cbs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, waiter] : waiters_) cbs.push_back(std::move(waiter.cb));
    waiters_.clear();
    by_key_.clear();
  }
  RunAll(cbs, why);
}

void KvEngine::ExpireWaiters(TimePoint now) {
  std::vector<WaitCallback> expired;
  std::vector<std::string> what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      const WaiterId id = it->first;
      UnindexLocked(id, it->second.keys);
      std::string keys;
      for (const std::string& key : it->second.keys) {
        if (PresentLocked(key)) continue;
        if (!keys.empty()) keys += ", ";
        if (keys.size() > 200) {
          keys += "...";
          break;
        }
        keys += "'" + Preview(key) + "'";
      }
      what.push_back(std::move(keys));
      expired.push_back(std::move(it->second.cb));
      it = waiters_.erase(it);
    }
  }
  for (std::size_t i = 0; i < expired.size(); ++i) {
    if (!expired[i]) continue;
    expired[i](absl::DeadlineExceededError(
        absl::StrCat("timed out waiting for store keys [", what[i],
                     "]; the process that should set them may have failed or not started yet")));
  }
}

std::optional<TimePoint> KvEngine::NextDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<TimePoint> next;
  for (const auto& [id, waiter] : waiters_) {
    if (!next || waiter.deadline < *next) next = waiter.deadline;
  }
  return next;
}

std::size_t KvEngine::NumWaiters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

std::vector<std::string> KvEngine::WaitedKeys(std::size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> keys;
  for (const auto& [key, ids] : by_key_) {
    if (!ids.empty() && !PresentLocked(key)) keys.insert(key);
  }
  std::vector<std::string> out(keys.begin(), keys.end());
  if (out.size() > max) out.resize(max);
  return out;
}

bool KvEngine::PresentLocked(const std::string& name) const {
  return data_.count(name) > 0 || queues_.count(name) > 0;
}

bool KvEngine::HasAllLocked(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [this](const std::string& k) { return PresentLocked(k); });
}

void KvEngine::CollectReadyLocked(const std::string& key, std::vector<WaitCallback>* out,
                                  std::size_t limit) {
  auto index = by_key_.find(key);
  if (index == by_key_.end()) return;
  std::vector<WaiterId> ready;
  // Ids grow with time and the set is ordered: the oldest waiters come first.
  for (WaiterId id : index->second) {
    if (ready.size() >= limit) break;
    auto w = waiters_.find(id);
    if (w != waiters_.end() && HasAllLocked(w->second.keys)) ready.push_back(id);
  }
  for (WaiterId id : ready) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;
    UnindexLocked(id, w->second.keys);
    out->push_back(std::move(w->second.cb));
    waiters_.erase(w);
  }
}

void KvEngine::UnindexLocked(WaiterId id, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    auto index = by_key_.find(key);
    if (index == by_key_.end()) continue;
    index->second.erase(id);
    if (index->second.empty()) by_key_.erase(index);
  }
}

}  // namespace ddprun::rendezvous
