// A small client of etcd's v3 API (gRPC; proto/etcd/), for ddprund's
// replicated control plane: KV (Range, Put, DeleteRange, Txn), leases (grant,
// revoke, a keeper that renews one) and watches. The gRPC types stay behind
// the pimpl.
//
// Endpoints: a list of etcd members. Each call goes to the member that last
// answered and moves on to the next one when a member is unreachable or has no
// quorum (gRPC UNAVAILABLE or a timeout), trying each member once. Every call
// has a deadline (EtcdOptions::call_timeout per member). A call that timed out
// may still have been applied by etcd: callers make their writes idempotent
// or guard them with a Txn compare.
//
// Errors, mapped once here: every member unreachable or without quorum is
// Unavailable (ErrorKind::kConnection) "etcd unreachable (H:P: why; ...);
// <fix>"; what etcd refuses (a request too large, too many operations in a
// transaction, an unknown lease) keeps etcd's code with "etcd at H:P refused
// the request: <etcd's message>".
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"

namespace ddprun::rendezvous {

// etcd's own default --max-request-bytes: it refuses any larger request.
inline constexpr std::int64_t kEtcdDefaultMaxRequestBytes = 1536 * 1024;

struct EtcdOptions {
  std::vector<HostPort> endpoints;
  // Per member and call.
  Duration call_timeout = std::chrono::seconds(2);
  // What an unreachable etcd tells the user to do (the caller knows its flags).
  std::string fix = "start etcd or fix --etcd_endpoints";
  // TLS to etcd (tls.h, client side): ca_file turns it on and verifies the
  // members; cert_file + key_file for etcd's --client-cert-auth. names: the
  // flags the files came from (--etcd_ca, ...), for messages.
  TlsOptions tls;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  std::int64_t count = 0;     // keys in the range (more than kvs.size() with a limit)
  std::int64_t revision = 0;  // the store's revision when it was read
};

// One comparison of a transaction: target(key) <result> number (or value).
// With range_end, it holds when it holds for every key in [key, range_end);
// a range with no key compares as one absent key (every number 0, no value).
struct EtcdCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  std::int64_t number = 0;     // every target but kValue
  std::string value;           // kValue
  std::string range_end = "";  // "" = the key alone; PrefixEnd(p) = every key under p
};

// One operation of a transaction.
struct EtcdOp {
  enum class Kind { kRange, kPut, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string range_end;   // kRange, kDelete: "" = the key alone
  std::string value;       // kPut
  std::int64_t lease = 0;  // kPut
  static EtcdOp Put(std::string key, std::string value, std::int64_t lease = 0);
  static EtcdOp Delete(std::string key, std::string range_end = "");
  static EtcdOp Range(std::string key, std::string range_end = "");
};

struct EtcdTxnResult {
  bool succeeded = false;         // the compares held: the success branch ran
  std::int64_t revision = 0;      // the store's revision after the transaction
  std::vector<EtcdRange> ranges;  // one per kRange op of the branch that ran, in order
};

struct EtcdLease {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;  // as granted (etcd raises a TTL below its minimum)
};

struct EtcdEvent {
  bool deleted = false;  // a DELETE (or an expired lease's key); otherwise a PUT
  EtcdKeyValue kv;
};

// Renews one lease over etcd's LeaseKeepAlive stream every TTL/3, moving to
// the next member on failure. Calls on_lost once, from its thread, when the
// lease is gone (etcd says so, or no renewal succeeded within the TTL since
// the last one). Stops on destruction.
class EtcdLeaseKeeper {
 public:
  virtual ~EtcdLeaseKeeper() = default;
  // Whether the lease is still known to be alive (renewed within its TTL).
  virtual bool Alive() const = 0;
};

// A watch of [key, range_end) from a revision: calls on_events from its thread
// for each batch, in revision order, resuming on another member after a broken
// stream without losing events. on_error once when it cannot go on (the
// revision was compacted). Stops on destruction.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
};

class EtcdClient {
 public:
  // InvalidArgument without endpoints, or an unreadable TLS file. Does not
  // connect yet.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();

  // limit 0: every key. range_end "" = the key alone; PrefixEnd(p) = every key under p.
  absl::StatusOr<EtcdRange> Range(const std::string& key, const std::string& range_end = "",
                                  std::int64_t limit = 0);
  // The revision of the put.
  absl::StatusOr<std::int64_t> Put(const std::string& key, const std::string& value,
                                   std::int64_t lease = 0);
  // How many keys were deleted.
  absl::StatusOr<std::int64_t> DeleteRange(const std::string& key,
                                           const std::string& range_end = "");
  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdOp>& success,
                                    const std::vector<EtcdOp>& failure = {});
  absl::StatusOr<EtcdLease> LeaseGrant(std::int64_t ttl_s);
  absl::Status LeaseRevoke(std::int64_t id);
  std::unique_ptr<EtcdLeaseKeeper> KeepAlive(EtcdLease lease,
                                             std::function<void(absl::Status)> on_lost);
  std::unique_ptr<EtcdWatch> Watch(const std::string& key, const std::string& range_end,
                                   std::int64_t start_revision,
                                   std::function<void(const std::vector<EtcdEvent>&)> on_events,
                                   std::function<void(absl::Status)> on_error);

  // Why etcd may have been unreachable: one TLS handshake of this client's
  // own (tls_probe.h: OpenSSL, classified on protocol facts, never on gRPC's
  // text) with each member, at most `timeout` each. Returns a
  // TlsHandshakeError (kind auth) for the first member whose handshake cannot
  // work, naming etcd, the member, the cause (plaintext against TLS, an
  // untrusted or misnamed certificate, mutual TLS without or with a refused
  // client certificate) and the flags to give (EtcdOptions::tls.names); Ok
  // when none is a TLS problem. Makes one connection per member: for an
  // error at start, not for every failed call.
  absl::Status DiagnoseTls(Duration timeout) const;

  // The member that answered last, "H:P".
  std::string endpoint() const;
  // Write calls made so far (Put, DeleteRange, Txn, whether they applied or not).
  std::int64_t writes() const;

  // The end of the range of every key that starts with prefix.
  static std::string PrefixEnd(const std::string& prefix);

  class Impl;

 private:
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
