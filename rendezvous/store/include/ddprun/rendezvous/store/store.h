// The Store: the key-value interface the worker SDK and the agent bootstrap
// through, like gloo's Store {set, get, wait} and c10d's Store.
//
// Implementations:
//   GrpcStore      (client.h)  talks to ddprund or the embedded rendezvous;
//   C10dStoreClient (c10d_store_client.h) talks to a c10d TCPStore (the
//                  agent's C10dStoreServer, or torch's own);
//   InMemoryStore  (here)      the in-process twin for tests;
//   PrefixStore    (here)      namespaces keys of another store.
// Every call that waits takes a timeout and returns DeadlineExceeded after it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

inline constexpr Duration kDefaultStoreTimeout = std::chrono::seconds(300);

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to timeout for key to exist, then returns its value.
  virtual absl::StatusOr<std::string> Get(const std::string& key, Duration timeout) = 0;
  virtual absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta) = 0;
  // Sets key to desired if it holds expected (or is absent, when expected is
  // nullopt). Returns whether it swapped; *current gets the value after.
  virtual absl::StatusOr<bool> CompareSet(const std::string& key,
                                          const std::optional<std::string>& expected,
                                          const std::string& desired,
                                          std::string* current) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;
  virtual absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                            Duration timeout) = 0;
};

class KvEngine;

// A Store over an in-process KvEngine. Thread-safe.
class InMemoryStore final : public Store {
 public:
  InMemoryStore();
  ~InMemoryStore() override;
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta) override;
  absl::StatusOr<bool> CompareSet(const std::string& key, const std::optional<std::string>& expected,
                                  const std::string& desired, std::string* current) override;
  absl::Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    Duration timeout) override;

 private:
  std::unique_ptr<KvEngine> engine_;
};

// Prepends "<prefix>/" to every key of an underlying store.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta) override;
  absl::StatusOr<bool> CompareSet(const std::string& key, const std::optional<std::string>& expected,
                                  const std::string& desired, std::string* current) override;
  absl::Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    Duration timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ddprun::rendezvous
