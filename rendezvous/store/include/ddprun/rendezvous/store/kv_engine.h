// The key-value engine behind every store this project serves: the gRPC Store
// service (one engine per job round), the c10d-compatible TCPStore server and
// InMemoryStore. It never blocks: waits are registered with a callback that
// runs exactly once, when every key exists, at the deadline, or on Cancel.
// Besides keys it holds FIFO queues (torch's TCPStore queue_push/queue_pop):
// a queue's name is apart from the keys (NumKeys and ListKeys count keys
// only), but a wait on a name is satisfied by a key or by a non-empty queue
// of that name, as in torch's server.
//
// Thread-safe. Callbacks run on the thread that satisfied or expired them,
// after the engine's lock is released, so a callback may call back in.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

// Limits that protect a server from a client that sends too much.
inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxValueBytes = 1 << 20;      // 1 MiB per value
inline constexpr std::size_t kMaxEngineBytes = 256u << 20;  // 256 MiB per engine
inline constexpr std::size_t kMaxWaitKeys = 65536;

struct QueuePopResult {
  std::int64_t length = 0;           // the queue's length before the pop
  std::optional<std::string> value;  // the front item, if length > 0
};

struct CompareSetResult {
  bool swapped = false;
  std::string current;  // the value after the call ("" when absent)
  bool exists = false;  // whether the key exists after the call
};

class KvEngine {
 public:
  using WaitCallback = std::function<void(absl::Status)>;
  using WaiterId = std::uint64_t;

  KvEngine() = default;
  KvEngine(const KvEngine&) = delete;
  KvEngine& operator=(const KvEngine&) = delete;
  // Cancels outstanding waiters with kCancelled.
  ~KvEngine();

  // Checks a key and value against the limits.
  static absl::Status CheckKey(const std::string& key);

  absl::Status Set(const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& key) const;
  // Adds delta to the decimal integer stored at key (0 when absent).
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta);
  // Sets key to desired if its value equals expected (or, with expected
  // unset, if it is absent). Returns the value after the call.
  absl::StatusOr<CompareSetResult> CompareSet(const std::string& key,
                                              const std::optional<std::string>& expected,
                                              std::string desired);
  bool Delete(const std::string& key);
  std::size_t NumKeys() const;
  // Every key (not queue names), unordered.
  std::vector<std::string> ListKeys() const;

  // Appends value to the queue `name` and wakes at most one waiter that it
  // satisfies (the oldest), so that one blocked pop gets one item.
  absl::Status QueuePush(const std::string& name, std::string value);
  // Takes the front item of queue `name`, if any.
  QueuePopResult QueuePop(const std::string& name);
  std::int64_t QueueLength(const std::string& name) const;
  // Every key and value, for persisting the engine (unordered).
  std::vector<std::pair<std::string, std::string>> Dump() const;
  bool Check(const std::vector<std::string>& keys) const;

  // Calls cb(OK) once every key exists (synchronously if they already do),
  // cb(DeadlineExceeded) when ExpireWaiters sees `deadline` pass, or
  // cb(status) on Cancel. Returns an id for Cancel (0 if already called).
  WaiterId WaitAsync(std::vector<std::string> keys, TimePoint deadline, WaitCallback cb);
  // Cancels one waiter; its callback runs with `why`. No-op if already done.
  void Cancel(WaiterId id, absl::Status why);
  // Cancels every waiter with `why`.
  void CancelAll(absl::Status why);
  // Times out every waiter whose deadline is <= now.
  void ExpireWaiters(TimePoint now);
  std::optional<TimePoint> NextDeadline() const;
  std::size_t NumWaiters() const;
  // The keys that waiters wait for and that do not exist yet, sorted, at most
  // `max` (what a stuck bootstrap waits for: hang reports name them).
  std::vector<std::string> WaitedKeys(std::size_t max) const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    TimePoint deadline;
    WaitCallback cb;
  };
  // A key exists, or a queue of that name holds an item.
  bool PresentLocked(const std::string& name) const;
  bool HasAllLocked(const std::vector<std::string>& keys) const;
  // Stores value at key (it: data_.find(key)) within kMaxEngineBytes and
  // collects the waiters it satisfies.
  absl::Status PutLocked(std::unordered_map<std::string, std::string>::iterator it,
                         const std::string& key, std::string value,
                         std::vector<WaitCallback>* ready);
  // Moves the callbacks of waiters that are now satisfied by `key` into out,
  // at most `limit` of them, oldest first.
  void CollectReadyLocked(const std::string& key, std::vector<WaitCallback>* out,
                          std::size_t limit = SIZE_MAX);
  // Removes waiter `id` from the by_key_ index of each of `keys`.
  void UnindexLocked(WaiterId id, const std::vector<std::string>& keys);

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> data_;
  // Never holds an empty queue: the last pop erases it.
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::size_t bytes_ = 0;
  WaiterId next_id_ = 1;
  std::map<WaiterId, Waiter> waiters_;
  // key -> the waiters on it: removing one waiter is O(log n), so releasing
  // or cancelling n waiters of one key is O(n log n), not O(n^2).
  std::unordered_map<std::string, std::set<WaiterId>> by_key_;
};

}  // namespace ddprun::rendezvous
