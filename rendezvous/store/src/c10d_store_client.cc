// C10dStoreClient: blocking calls over a non-blocking socket, every wait
// bounded. The wire is c10d_wire.cc; the sockets are socket_util.cc.
#include "ddprun/rendezvous/store/c10d_store_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr std::chrono::seconds kReplyTimeout{60};
constexpr std::chrono::seconds kMinAttemptTime{5};
constexpr c10d::Dialect kDialect = c10d::Dialect::kModern;

Duration FromSeconds(double seconds) {
  return std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(std::max(0.0, seconds)));
}

double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

// A timeout for a message: "1 s" for 0.999969 s, tenths below 10 s ("0.5 s").
std::string SecondsText(Duration d) {
  const double s = ToSeconds(d);
  std::string text = s >= 9.95 ? absl::StrFormat("%.0f", s) : absl::StrFormat("%.1f", s);
  if (absl::EndsWith(text, ".0")) text.resize(text.size() - 2);
  return text + " s";
}

TimePoint ReplyDeadline() { return SteadyClock::now() + kReplyTimeout; }

// "store key 'a'", "store keys 'a', 'b'", for timeout messages.
std::string KeysForMessage(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 3;
  std::vector<std::string> quoted;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) quoted.push_back("'" + keys[i] + "'");
  std::string out =
      absl::StrCat(keys.size() == 1 ? "store key " : "store keys ", absl::StrJoin(quoted, ", "));
  if (keys.size() > kShown) absl::StrAppend(&out, " and ", keys.size() - kShown, " more");
  return out;
}

c10d::Request MakeRequest(c10d::Op op, std::vector<std::string_view> keys = {},
                          std::vector<std::string_view> values = {}) {
  c10d::Request req;
  req.op = op;
  req.keys = std::move(keys);
  req.values = std::move(values);
  return req;
}

// The torch 2.x handshake: VALIDATE with the magic, then a PING round trip.
absl::Status Handshake(int fd, TimePoint deadline) {
  std::string msg;
  c10d::Request validate = MakeRequest(c10d::Op::kValidate);
  validate.u32 = c10d::kValidationMagic;
  c10d::Request ping = MakeRequest(c10d::Op::kPing);
  ping.u32 = static_cast<std::uint32_t>(::getpid());
  DDPRUN_RETURN_IF_ERROR(c10d::EncodeRequest(kDialect, validate, &msg));
  DDPRUN_RETURN_IF_ERROR(c10d::EncodeRequest(kDialect, ping, &msg));
  DDPRUN_RETURN_IF_ERROR(net::SendAll(fd, msg, deadline));
  std::uint32_t echo = 0;
  DDPRUN_RETURN_IF_ERROR(
      net::RecvExact(fd, reinterpret_cast<char*>(&echo), sizeof(echo), deadline));
  if (echo != ping.u32) {
    return absl::UnavailableError(
        "the TCPStore answered PING with a wrong nonce; the port is not a c10d TCPStore");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<C10dStoreClient>> C10dStoreClient::Connect(const std::string& host,
                                                                          int port,
                                                                          double timeout_s) {
  return Connect(host, port, FromSeconds(timeout_s));
}

absl::StatusOr<std::unique_ptr<C10dStoreClient>> C10dStoreClient::Connect(const std::string& host,
                                                                          int port,
                                                                          Duration timeout) {
  return Connect(host, port, timeout,
                 "check that the store is running and that --master_addr/--master_port are right");
}

absl::StatusOr<std::unique_ptr<C10dStoreClient>> C10dStoreClient::Connect(const std::string& host,
                                                                          int port,
                                                                          Duration timeout,
                                                                          const std::string& fix) {
  const std::string where = FormatHostPort(host, port);
  const TimePoint deadline = SteadyClock::now() + std::max(timeout, Duration::zero());
  std::string last_error = "no attempt was made";
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    absl::StatusOr<std::vector<net::SocketAddress>> resolved = net::ResolveTcp(host, port);
    std::vector<net::SocketAddress> addresses;
    if (resolved.ok()) {
      addresses = *std::move(resolved);
    } else {
      last_error = std::string(resolved.status().message());
    }
    for (const net::SocketAddress& address : addresses) {
      // Each attempt gets at least a few seconds, even past a short deadline.
      const TimePoint attempt_deadline = std::max(deadline, SteadyClock::now() + kMinAttemptTime);
      absl::StatusOr<net::UniqueFd> fd = net::ConnectTcp(address, attempt_deadline);
      if (!fd.ok()) {
        last_error = std::string(fd.status().message());
        continue;
      }
      const absl::Status st = Handshake(fd->get(), attempt_deadline);
      if (st.ok()) {
        DDPRUN_DEBUG_LOG(kStore) << "connected to the TCPStore at " << where;
        return std::unique_ptr<C10dStoreClient>(new C10dStoreClient(fd->release(), where));
      }
      last_error = std::string(st.message());
    }
    if (SteadyClock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Duration>(backoff, deadline - SteadyClock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to the TCPStore at ", where,
                                             " within ", SecondsText(timeout), ": ", last_error,
                                             "; ", fix));
}

C10dStoreClient::C10dStoreClient(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}

C10dStoreClient::~C10dStoreClient() { ::close(fd_); }

absl::Status C10dStoreClient::Annotate(const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("TCPStore at ", where_, ": ", status.message(),
                                   "; the store server stopped or rejected a request"));
}

absl::Status C10dStoreClient::SendLocked(const c10d::Request& req) {
  std::string msg;
  DDPRUN_RETURN_IF_ERROR(c10d::EncodeRequest(kDialect, req, &msg));
  return Annotate(net::SendAll(fd_, msg, ReplyDeadline()));
}

template <typename T>
absl::StatusOr<T> C10dStoreClient::RecvLocked(TimePoint deadline) {
  T v{};
  DDPRUN_RETURN_IF_ERROR(
      Annotate(net::RecvExact(fd_, reinterpret_cast<char*>(&v), sizeof(T), deadline)));
  return v;
}

absl::StatusOr<std::string> C10dStoreClient::RecvStringLocked(TimePoint deadline) {
  DDPRUN_ASSIGN_OR_RETURN(const std::uint64_t len, RecvLocked<std::uint64_t>(deadline));
  if (len > kMaxValueBytes) {
    return absl::UnavailableError(absl::StrCat("the TCPStore at ", where_, " sent a value of ", len,
                                               " bytes, over the limit of ", kMaxValueBytes,
                                               " bytes; the port is not a c10d TCPStore"));
  }
  std::string value(len, '\0');
  DDPRUN_RETURN_IF_ERROR(Annotate(net::RecvExact(fd_, value.data(), value.size(), deadline)));
  return value;
}

absl::Status C10dStoreClient::WaitLocked(const std::vector<std::string>& keys, Duration timeout) {
  DDPRUN_RETURN_IF_ERROR(SendLocked(
      MakeRequest(c10d::Op::kWait, std::vector<std::string_view>(keys.begin(), keys.end()))));
  const TimePoint wait_deadline = SteadyClock::now() + std::max(timeout, Duration::zero());
  absl::StatusOr<std::uint8_t> reply = RecvLocked<std::uint8_t>(wait_deadline);
  if (reply.ok()) {
    if (*reply != c10d::kStopWaiting) {
      return absl::UnavailableError(
          "the TCPStore answered WAIT unexpectedly; the port is not a c10d TCPStore");
    }
    return absl::OkStatus();
  }
  if (!absl::IsDeadlineExceeded(reply.status())) return reply.status();
  // Cancel; the server answers WAIT_CANCELED, possibly after a late STOP_WAITING.
  DDPRUN_RETURN_IF_ERROR(SendLocked(MakeRequest(c10d::Op::kCancelWait)));
  DDPRUN_ASSIGN_OR_RETURN(std::uint8_t ack, RecvLocked<std::uint8_t>(ReplyDeadline()));
  const bool arrived = ack == c10d::kStopWaiting;
  if (arrived) {
    DDPRUN_ASSIGN_OR_RETURN(ack, RecvLocked<std::uint8_t>(ReplyDeadline()));
  }
  if (ack != c10d::kWaitCanceled) {
    return absl::UnavailableError(
        "the TCPStore answered CANCEL_WAIT unexpectedly; the port is not a c10d TCPStore");
  }
  if (arrived) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("timed out after ", SecondsText(timeout), " waiting for ", KeysForMessage(keys),
                   "; the process that should set it may have failed or not started yet"));
}

absl::Status C10dStoreClient::Set(const std::string& key, const std::string& value) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store value of ", value.size(), " bytes exceeds the limit of ", kMaxValueBytes,
        " bytes; store large data elsewhere and put its path in the store"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return SendLocked(MakeRequest(c10d::Op::kSet, {key}, {value}));
}

absl::StatusOr<std::string> C10dStoreClient::Get(const std::string& key, double timeout_s) {
  return Get(key, FromSeconds(timeout_s));
}

absl::StatusOr<std::string> C10dStoreClient::Get(const std::string& key, Duration timeout) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  DDPRUN_RETURN_IF_ERROR(WaitLocked({key}, timeout));
  DDPRUN_RETURN_IF_ERROR(SendLocked(MakeRequest(c10d::Op::kGet, {key})));
  return RecvStringLocked(ReplyDeadline());
}

absl::StatusOr<std::int64_t> C10dStoreClient::Add(const std::string& key, std::int64_t delta) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  c10d::Request req = MakeRequest(c10d::Op::kAdd, {key});
  req.delta = delta;
  DDPRUN_RETURN_IF_ERROR(SendLocked(req));
  return RecvLocked<std::int64_t>(ReplyDeadline());
}

absl::StatusOr<bool> C10dStoreClient::CompareSet(const std::string& key,
                                                 const std::optional<std::string>& expected,
                                                 const std::string& desired, std::string* current) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string_view want = expected ? std::string_view(*expected) : std::string_view();
  DDPRUN_RETURN_IF_ERROR(SendLocked(MakeRequest(c10d::Op::kCompareSet, {key}, {want, desired})));
  DDPRUN_ASSIGN_OR_RETURN(std::string after, RecvStringLocked(ReplyDeadline()));
  const bool swapped = after == desired;
  if (current != nullptr) *current = std::move(after);
  return swapped;
}

absl::Status C10dStoreClient::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitLocked(keys, timeout);
}

absl::StatusOr<bool> C10dStoreClient::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  DDPRUN_RETURN_IF_ERROR(SendLocked(MakeRequest(c10d::Op::kDeleteKey, {key})));
  DDPRUN_ASSIGN_OR_RETURN(const std::int64_t deleted, RecvLocked<std::int64_t>(ReplyDeadline()));
  return deleted != 0;
}

absl::StatusOr<std::vector<std::string>> C10dStoreClient::MultiGet(
    const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> values;
  if (keys.empty()) return values;
  DDPRUN_RETURN_IF_ERROR(WaitLocked(keys, timeout));
  DDPRUN_RETURN_IF_ERROR(SendLocked(
      MakeRequest(c10d::Op::kMultiGet, std::vector<std::string_view>(keys.begin(), keys.end()))));
  const TimePoint deadline = ReplyDeadline();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    DDPRUN_ASSIGN_OR_RETURN(std::string value, RecvStringLocked(deadline));
    values.push_back(std::move(value));
  }
  return values;
}

}  // namespace ddprun::rendezvous
