// A client of PyTorch's c10d TCPStore protocol (c10d_wire.h), speaking the
// torch 2.x dialect as torch 2's own client does: VALIDATE + PING on connect.
// It is a Store, so whatever bootstraps through a Store can use the workers'
// TCPStore (C10dStoreServer, or torch's own). Used by static-rendezvous
// agents to read the keys node rank 0 publishes, and by tests.
//
// Thread-safe: one request at a time on the one connection. Every call is
// bounded: waits by their timeout, other replies by 60 s. A lost connection
// is Unavailable, and the client stays unusable afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/store/c10d_wire.h"
#include "ddprun/rendezvous/store/store.h"

namespace ddprun::rendezvous {

class C10dStoreClient final : public Store {
 public:
  // Connects and handshakes, retrying until `timeout` elapses (each attempt
  // gets at least 5 s). Unavailable, naming host:port and the last error.
  static absl::StatusOr<std::unique_ptr<C10dStoreClient>> Connect(const std::string& host, int port,
                                                                  Duration timeout);
  // The same, ending the error with `fix` (what the caller's user should do)
  // instead of the default's advice about --master_addr/--master_port.
  static absl::StatusOr<std::unique_ptr<C10dStoreClient>> Connect(const std::string& host, int port,
                                                                  Duration timeout,
                                                                  const std::string& fix);
  // The same with the timeout in seconds, as flags give it.
  static absl::StatusOr<std::unique_ptr<C10dStoreClient>> Connect(const std::string& host, int port,
                                                                  double timeout_s);
  ~C10dStoreClient() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  // WAIT (up to timeout) then GET. On timeout the wait is cancelled on the
  // server (CANCEL_WAIT) and the client stays usable.
  absl::StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  absl::StatusOr<std::string> Get(const std::string& key, double timeout_s);
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta) override;
  // torch's COMPARE_SET: an `expected` of nullopt or "" matches a missing key
  // (or an empty value). The reply, the value after the call, goes to
  // *current; the result is whether it equals `desired` (the wire says no
  // more: a key that already held `desired` also reads as swapped, and a
  // missing key with a non-empty `expected` replies `expected`).
  absl::StatusOr<bool> CompareSet(const std::string& key,
                                  const std::optional<std::string>& expected,
                                  const std::string& desired, std::string* current) override;
  absl::Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  // WAIT for every key (up to timeout), then MULTI_GET.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    Duration timeout) override;

 private:
  C10dStoreClient(int fd, std::string where);
  absl::Status SendLocked(const c10d::Request& req);
  absl::Status WaitLocked(const std::vector<std::string>& keys, Duration timeout);
  absl::StatusOr<std::string> RecvStringLocked(TimePoint deadline);
  template <typename T>
  absl::StatusOr<T> RecvLocked(TimePoint deadline);
  // Names the store and the likely cause in a socket error.
  absl::Status Annotate(const absl::Status& status) const;

  std::mutex mu_;  // one request and its reply at a time
  const int fd_;
  const std::string where_;  // host:port, for messages
};

}  // namespace ddprun::rendezvous
