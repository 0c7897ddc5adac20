// A server and a client for PyTorch's c10d TCPStore wire protocol.
//
// Wire format (both dialects; little-endian, as torch sends host order on x86/arm):
//   request  = u8 query-type, then the query's fields
//   string   = u64 length, then that many bytes (keys and values alike)
//   count    = u64 (number of keys that follow, for CHECK/WAIT/MULTI_*)
//   int      = i64 (ADD delta and replies, GETNUMKEYS, DELETE_KEY replies)
//
// Dialects, detected per connection from its first bytes:
//   legacy (torch 1.13 and 2.0): no handshake. Query types
//     SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 WATCH_KEY=7
//     DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12.
//     torch 1.13 also opens a second "callback" connection that stays silent
//     unless watch_key() is called.
//   modern (torch 2.2+): the first query is VALIDATE (u8 0, u32 0x3C85F7CE),
//     usually followed by PING (u32 nonce, echoed back). Query types
//     VALIDATE=0 SET=1 COMPARE_SET=2 GET=3 ADD=4 CHECK=5 WAIT=6 GETNUMKEYS=7
//     DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 PING=13
//     QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16.
//   A first byte 0 followed by the magic is VALIDATE; anything else is legacy
//   (a legacy SET follows the 0 with a u64 key length, whose low four bytes
//   can never equal the magic for a key within kMaxKeyBytes).
//
// Replies: SET/APPEND/MULTI_SET/VALIDATE none; GET/COMPARE_SET a string;
// ADD/GETNUMKEYS/DELETE_KEY an i64; CHECK u8 READY=0/NOT_READY=1; WAIT u8
// STOP_WAITING=0 once every key exists; CANCEL_WAIT u8 WAIT_CANCELED=1;
// MULTI_GET one string per key; PING the nonce.
//
// Not supported (the connection is closed with a log line): WATCH_KEY, the
// queue queries and anything newer than QUEUE_LEN (e.g. LIST_KEYS), which
// env:// rendezvous and the gloo/NCCL process groups do not send. Neither is
// the torch 2.1-era numbering (no VALIDATE, no WATCH_KEY: DELETE_KEY=7 ...),
// which cannot be told apart from the legacy one on the wire.
#include "ddprun/rendezvous/c10d_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/errors.h"
#include "ddprun/rendezvous/kv_engine.h"

namespace ddprun::rendezvous {
namespace {

constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
// The largest request buffered whole (MULTI_SET can carry many values).
constexpr std::size_t kMaxRequestBytes = 64u << 20;
// A client whose unread replies exceed this is not read from until it drains;
// past kMaxPendingOutputBytes it is disconnected.
constexpr std::size_t kOutputHighWater = 4u << 20;
constexpr std::size_t kMaxPendingOutputBytes = 64u << 20;
constexpr std::size_t kMaxConnections = 16384;
constexpr std::size_t kReadChunk = 64u << 10;
// Per poll round, read at most this much from one client (fairness).
constexpr std::size_t kMaxReadPerRound = 1u << 20;

constexpr std::uint8_t kCheckReady = 0;
constexpr std::uint8_t kCheckNotReady = 1;
constexpr std::uint8_t kStopWaiting = 0;
constexpr std::uint8_t kWaitCanceled = 1;

enum class Dialect { kUnknown, kLegacy, kModern };

enum class Op {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kUnknown,
};

Op DecodeOp(Dialect dialect, std::uint8_t b) {
  static constexpr Op kLegacy[] = {Op::kSet,       Op::kCompareSet, Op::kGet,        Op::kAdd,
                                   Op::kCheck,     Op::kWait,       Op::kGetNumKeys, Op::kWatchKey,
                                   Op::kDeleteKey, Op::kAppend,     Op::kMultiGet,   Op::kMultiSet,
                                   Op::kCancelWait};
  static constexpr Op kModern[] = {Op::kValidate,   Op::kSet,    Op::kCompareSet, Op::kGet,
                                   Op::kAdd,        Op::kCheck,  Op::kWait,       Op::kGetNumKeys,
                                   Op::kDeleteKey,  Op::kAppend, Op::kMultiGet,   Op::kMultiSet,
                                   Op::kCancelWait, Op::kPing,   Op::kQueuePush,  Op::kQueuePop,
                                   Op::kQueueLen};
  if (dialect == Dialect::kLegacy && b < std::size(kLegacy)) return kLegacy[b];
  if (dialect == Dialect::kModern && b < std::size(kModern)) return kModern[b];
  return Op::kUnknown;
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kValidate:
      return "VALIDATE";
    case Op::kSet:
      return "SET";
    case Op::kCompareSet:
      return "COMPARE_SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kGetNumKeys:
      return "GETNUMKEYS";
    case Op::kWatchKey:
      return "WATCH_KEY";
    case Op::kDeleteKey:
      return "DELETE_KEY";
    case Op::kAppend:
      return "APPEND";
    case Op::kMultiGet:
      return "MULTI_GET";
    case Op::kMultiSet:
      return "MULTI_SET";
    case Op::kCancelWait:
      return "CANCEL_WAIT";
    case Op::kPing:
      return "PING";
    case Op::kQueuePush:
      return "QUEUE_PUSH";
    case Op::kQueuePop:
      return "QUEUE_POP";
    case Op::kQueueLen:
      return "QUEUE_LEN";
    case Op::kUnknown:
      break;
  }
  return "UNKNOWN";
}

// One parsed request. Views point into the connection's input buffer and are
// valid until the request's bytes are consumed.
struct Request {
  Op op = Op::kUnknown;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> values;
  std::int64_t i64 = 0;
  std::uint32_t u32 = 0;
};

enum class ParseResult { kOk, kNeedMore, kBad };

// A bounds-checked cursor. On a short read it records how many bytes the
// buffer must hold before the read can succeed.
class Reader {
 public:
  Reader(std::string_view data) : data_(data) {}

  template <typename T>
  bool Value(T* out) {
    if (!Need(sizeof(T))) return false;
    std::memcpy(out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // Reads a u64 length and that many bytes. Sets *too_big (and fails) when
  // the length exceeds `limit`.
  bool Bytes(std::size_t limit, std::string_view* out, bool* too_big, std::uint64_t* len_out) {
    std::uint64_t len = 0;
    if (!Value(&len)) return false;
    *len_out = len;
    if (len > limit) {
      *too_big = true;
      return false;
    }
    if (!Need(static_cast<std::size_t>(len))) return false;
    *out = data_.substr(pos_, len);
    pos_ += len;
    return true;
  }
  std::size_t pos() const { return pos_; }
  std::size_t need() const { return need_; }

 private:
  bool Need(std::size_t n) {
    if (data_.size() - pos_ >= n) return true;
    need_ = pos_ + n;
    return false;
  }
  std::string_view data_;
  std::size_t pos_ = 0;
  std::size_t need_ = 0;
};

// Parses one request of `dialect` from the front of `data`.
ParseResult ParseRequest(Dialect dialect, std::string_view data, Request* req,
                         std::size_t* consumed, std::size_t* need, std::string* error) {
  Reader r(data);
  *req = Request{};
  bool too_big = false;
  std::uint64_t len = 0;
  auto more = [&]() {
    if (too_big) return ParseResult::kBad;
    *need = r.need();
    return ParseResult::kNeedMore;
  };
  auto key = [&]() {
    std::string_view k;
    if (!r.Bytes(kMaxKeyBytes, &k, &too_big, &len)) {
      if (too_big) {
        *error = absl::StrCat(OpName(req->op), " sent a key of ", len, " bytes, over the limit of ",
                              kMaxKeyBytes);
      }
      return false;
    }
    req->keys.push_back(k);
    return true;
  };
  auto value = [&]() {
    std::string_view v;
    if (!r.Bytes(kMaxValueBytes, &v, &too_big, &len)) {
      if (too_big) {
        *error = absl::StrCat(OpName(req->op), " sent a value of ", len,
                              " bytes, over the limit of ", kMaxValueBytes);
      }
      return false;
    }
    req->values.push_back(v);
    return true;
  };
  auto count = [&](std::uint64_t* n) {
    if (!r.Value(n)) return false;
    if (*n > kMaxWaitKeys) {
      too_big = true;
      *error = absl::StrCat(OpName(req->op), " sent a count of ", *n, " keys, over the limit of ",
                            kMaxWaitKeys);
      return false;
    }
    return true;
  };

  std::uint8_t type = 0;
  if (!r.Value(&type)) return more();
  req->op = DecodeOp(dialect, type);
  std::uint64_t n = 0;
  switch (req->op) {
    case Op::kValidate:
    case Op::kPing:
      if (!r.Value(&req->u32)) return more();
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      if (!key() || !value()) return more();
      break;
    case Op::kCompareSet:
      if (!key() || !value() || !value()) return more();
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      if (!key()) return more();
      break;
    case Op::kAdd:
      if (!key() || !r.Value(&req->i64)) return more();
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      if (!count(&n)) return more();
      for (std::uint64_t i = 0; i < n; ++i) {
        if (!key()) return more();
      }
      break;
    case Op::kMultiSet:
      if (!count(&n)) return more();
      for (std::uint64_t i = 0; i < n; ++i) {
        if (!key() || !value()) return more();
      }
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
      break;
    case Op::kUnknown:
      *error = absl::StrCat("unknown query type ", static_cast<int>(type),
                            dialect == Dialect::kModern
                                ? " (queries newer than torch 2.8's QUEUE_LEN are not supported)"
                                : " (torch 1.13 dialect)");
      return ParseResult::kBad;
  }
  *consumed = r.pos();
  return ParseResult::kOk;
}

template <typename T>
void AppendValue(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void AppendBytes(std::string* out, std::string_view bytes) {
  AppendValue<std::uint64_t>(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Logs one line to stderr; protocol errors from many clients are rate-limited.
void LogLine(const std::string& line) {
  std::fprintf(stderr, "ddprun: c10d store: %s\n", line.c_str());
}

void LogProtocolError(const std::string& line) {
  static std::atomic<std::uint64_t> count{0};
  const std::uint64_t n = count.fetch_add(1);
  if (n < 20 || n % 1000 == 0) {
    LogLine(n < 20 ? line : absl::StrCat(line, " (", n + 1, " such errors so far)"));
  }
}

std::string PeerName(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

// ---------------------------------------------------------------------------
// C10dStoreServer::Impl

class C10dStoreServer::Impl {
 public:
  Impl(int listen_fd, int wake_fd, int port)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port),
        engine_(std::make_unique<KvEngine>()) {}

  ~Impl() {
    stop_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
    // The loop has exited: close every client (cancelling its waits).
    for (auto& [id, conn] : conns_) DropConnection(conn);
    conns_.clear();
    ::close(listen_fd_);
    std::lock_guard<std::mutex> lock(done_mu_);
    ::close(wake_fd_);
    wake_fd_ = -1;
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  int port() const { return port_; }
  KvEngine& engine() { return *engine_; }

 private:
  struct Connection {
    std::uint64_t id = 0;
    int fd = -1;
    std::string peer;
    Dialect dialect = Dialect::kUnknown;
    std::string in;
    std::size_t in_need = 1;  // parse only once `in` holds this many bytes
    std::string out;
    std::size_t out_off = 0;
    bool eof = false;
    bool dead = false;
    std::uint64_t next_token = 1;
    // Pending WAITs: token -> engine waiter id (0 when it fired synchronously).
    std::map<std::uint64_t, KvEngine::WaiterId> waits;
  };
  struct Completion {
    std::uint64_t conn_id;
    std::uint64_t token;
    absl::Status status;
  };

  void Wake() {
    std::lock_guard<std::mutex> lock(done_mu_);
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  // Called by the engine on any thread when a WAIT finishes.
  void OnWaitDone(std::uint64_t conn_id, std::uint64_t token, absl::Status status) {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_.push_back(Completion{conn_id, token, std::move(status)});
    if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
    }
  }

  void Run() {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    while (!stop_.load()) {
      fds.clear();
      ids.clear();
      fds.push_back(pollfd{wake_fd_, POLLIN, 0});
      fds.push_back(
          pollfd{listen_fd_, static_cast<short>(conns_.size() < kMaxConnections ? POLLIN : 0), 0});
      for (auto& [id, conn] : conns_) {
        short events = 0;
        if (!conn.eof && conn.out.size() - conn.out_off < kOutputHighWater) events |= POLLIN;
        if (conn.out.size() > conn.out_off) events |= POLLOUT;
        fds.push_back(pollfd{conn.fd, events, 0});
        ids.push_back(id);
      }
      int rc = ::poll(fds.data(), fds.size(), -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        LogLine(absl::StrCat("poll failed: ", std::strerror(errno), "; the store stops serving"));
        return;
      }
      if (fds[0].revents) {
        std::uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof(v));
        if (stop_.load()) return;
      }
      if (fds[1].revents & POLLIN) AcceptAll();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const short rev = fds[i + 2].revents;
        if (!rev) continue;
        auto it = conns_.find(ids[i]);
        if (it == conns_.end()) continue;
        Connection& conn = it->second;
        if (rev & (POLLIN | POLLHUP | POLLERR)) ReadFrom(conn);
        if (!conn.dead) Process(conn);
        if (!conn.dead && (rev & POLLOUT)) Flush(conn);
      }
      ProcessCompletions();
      for (auto it = conns_.begin(); it != conns_.end();) {
        Connection& conn = it->second;
        // A client that closed its end has had its buffered requests served;
        // its replies cannot be delivered once it is gone, so drop it.
        if (conn.dead || (conn.eof && conn.out.size() == conn.out_off)) {
          DropConnection(conn);
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void AcceptAll() {
    while (conns_.size() < kMaxConnections) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          LogLine(absl::StrCat("accept failed: ", std::strerror(errno)));
        }
        return;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const std::uint64_t id = next_conn_id_++;
      Connection& conn = conns_[id];
      conn.id = id;
      conn.fd = fd;
      conn.peer = PeerName(addr);
    }
  }

  void ReadFrom(Connection& conn) {
    std::size_t total = 0;
    while (total < kMaxReadPerRound) {
      const std::size_t old = conn.in.size();
      conn.in.resize(old + kReadChunk);
      ssize_t n = ::recv(conn.fd, conn.in.data() + old, kReadChunk, 0);
      if (n > 0) {
        conn.in.resize(old + n);
        total += n;
        if (static_cast<std::size_t>(n) < kReadChunk) return;
        continue;
      }
      conn.in.resize(old);
      if (n == 0) {
        conn.eof = true;
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // ECONNRESET and the like: the client is gone.
      conn.eof = true;
      conn.dead = true;
      return;
    }
  }

  void Close(Connection& conn, const std::string& why) {
    LogProtocolError(absl::StrCat("closing the connection from ", conn.peer, ": ", why));
    conn.dead = true;
  }

  void DropConnection(Connection& conn) {
    // Cancel this client's waits; their completions find no connection and are dropped.
    std::map<std::uint64_t, KvEngine::WaiterId> waits;
    waits.swap(conn.waits);
    for (auto& [token, waiter] : waits) {
      if (waiter != 0) engine_->Cancel(waiter, absl::CancelledError("the client disconnected"));
    }
    if (conn.fd >= 0) ::close(conn.fd);
    conn.fd = -1;
  }

  // Serves every complete request buffered on `conn`.
  void Process(Connection& conn) {
    std::size_t offset = 0;
    while (!conn.dead && conn.in.size() - offset >= conn.in_need) {
      std::string_view data(conn.in.data() + offset, conn.in.size() - offset);
      if (conn.dialect == Dialect::kUnknown) {
        if (static_cast<std::uint8_t>(data[0]) != 0) {
          conn.dialect = Dialect::kLegacy;
        } else if (data.size() < 5) {
          conn.in_need = 5;
          break;
        } else {
          std::uint32_t magic;
          std::memcpy(&magic, data.data() + 1, sizeof(magic));
          conn.dialect = magic == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
        }
      }
      Request req;
      std::size_t consumed = 0, need = 0;
      std::string error;
      ParseResult res = ParseRequest(conn.dialect, data, &req, &consumed, &need, &error);
      if (res == ParseResult::kBad) {
        Close(conn, absl::StrCat("malformed request: ", error));
        break;
      }
      if (res == ParseResult::kNeedMore) {
        if (need > kMaxRequestBytes) {
          Close(conn, absl::StrCat("a request of more than ", need, " bytes exceeds the limit of ",
                                   kMaxRequestBytes, " bytes"));
          break;
        }
        conn.in_need = need;
        break;
      }
      conn.in_need = 1;
      Execute(conn, req);
      offset += consumed;
    }
    if (offset > 0) conn.in.erase(0, offset);
    if (!conn.dead && conn.out.size() > conn.out_off) Flush(conn);
  }

  void Flush(Connection& conn) {
    while (conn.out.size() > conn.out_off) {
      ssize_t n = ::send(conn.fd, conn.out.data() + conn.out_off, conn.out.size() - conn.out_off,
                         MSG_NOSIGNAL);
      if (n > 0) {
        conn.out_off += n;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      conn.dead = true;  // EPIPE, ECONNRESET: the client is gone.
      return;
    }
    if (conn.out_off == conn.out.size()) {
      conn.out.clear();
      conn.out_off = 0;
    } else if (conn.out_off > (1u << 20)) {
      conn.out.erase(0, conn.out_off);
      conn.out_off = 0;
    }
    if (conn.out.size() - conn.out_off > kMaxPendingOutputBytes) {
      Close(conn, "the client does not read its replies");
    }
  }

  void ProcessCompletions() {
    std::vector<Completion> done;
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      done.swap(done_);
    }
    for (Completion& c : done) {
      auto it = conns_.find(c.conn_id);
      if (it == conns_.end()) continue;
      Connection& conn = it->second;
      if (conn.dead || conn.waits.erase(c.token) == 0) continue;  // cancelled meanwhile
      if (c.status.ok()) {
        AppendValue<std::uint8_t>(&conn.out, kStopWaiting);
        Flush(conn);
      } else {
        Close(conn, absl::StrCat("a WAIT ended with an error: ", c.status.message()));
      }
    }
  }

  void Execute(Connection& conn, const Request& req) {
    auto str = [](std::string_view v) { return std::string(v); };
    switch (req.op) {
      case Op::kValidate:
        if (req.u32 != kValidationMagic) Close(conn, "VALIDATE sent a wrong magic number");
        return;
      case Op::kPing:
        AppendValue<std::uint32_t>(&conn.out, req.u32);
        return;
      case Op::kSet: {
        absl::Status st = engine_->Set(str(req.keys[0]), str(req.values[0]));
        if (!st.ok()) Close(conn, std::string(st.message()));
        return;
      }
      case Op::kCompareSet: {
        // torch semantics: an empty `expected` matches a missing key; a missing
        // key with a non-empty `expected` is left alone and `expected` is returned.
        const std::string key = str(req.keys[0]);
        const std::string expected = str(req.values[0]);
        std::optional<std::string> want;
        if (!expected.empty()) want = expected;
        absl::StatusOr<CompareSetResult> r = engine_->CompareSet(key, want, str(req.values[1]));
        if (r.ok() && !r->swapped && r->exists && expected.empty() && r->current.empty()) {
          r = engine_->CompareSet(key, std::string(), str(req.values[1]));
        }
        if (!r.ok()) {
          Close(conn, std::string(r.status().message()));
          return;
        }
        AppendBytes(&conn.out, r->exists ? std::string_view(r->current) : req.values[0]);
        return;
      }
      case Op::kGet: {
        // Clients WAIT before GET; a key deleted in between reads as empty.
        std::optional<std::string> v = engine_->Get(str(req.keys[0]));
        AppendBytes(&conn.out, v ? *v : std::string());
        return;
      }
      case Op::kAdd: {
        absl::StatusOr<std::int64_t> r = engine_->Add(str(req.keys[0]), req.i64);
        if (!r.ok()) {
          Close(conn, std::string(r.status().message()));
          return;
        }
        AppendValue<std::int64_t>(&conn.out, *r);
        return;
      }
      case Op::kCheck: {
        std::vector<std::string> keys(req.keys.begin(), req.keys.end());
        AppendValue<std::uint8_t>(&conn.out, engine_->Check(keys) ? kCheckReady : kCheckNotReady);
        return;
      }
      case Op::kWait: {
        std::vector<std::string> keys(req.keys.begin(), req.keys.end());
        if (engine_->Check(keys)) {
          AppendValue<std::uint8_t>(&conn.out, kStopWaiting);
          return;
        }
        const std::uint64_t token = conn.next_token++;
        const std::uint64_t conn_id = conn.id;
        conn.waits[token] = 0;
        KvEngine::WaiterId id = engine_->WaitAsync(std::move(keys), TimePoint::max(),
                                                   [this, conn_id, token](absl::Status status) {
                                                     OnWaitDone(conn_id, token, std::move(status));
                                                   });
        auto it = conn.waits.find(token);
        if (it != conn.waits.end()) it->second = id;
        return;
      }
      case Op::kGetNumKeys:
        AppendValue<std::int64_t>(&conn.out, static_cast<std::int64_t>(engine_->NumKeys()));
        return;
      case Op::kDeleteKey:
        AppendValue<std::int64_t>(&conn.out, engine_->Delete(str(req.keys[0])) ? 1 : 0);
        return;
      case Op::kAppend: {
        const std::string key = str(req.keys[0]);
        // Compare-and-set until no other writer interleaves.
        for (int attempt = 0;; ++attempt) {
          std::optional<std::string> cur = engine_->Get(key);
          std::string next = cur ? *cur : std::string();
          next.append(req.values[0]);
          absl::StatusOr<CompareSetResult> r = engine_->CompareSet(key, cur, std::move(next));
          if (!r.ok()) {
            Close(conn, std::string(r.status().message()));
            return;
          }
          if (r->swapped) return;
          if (attempt > 1000) {
            Close(conn, "APPEND kept racing with other writers");
            return;
          }
        }
      }
      case Op::kMultiGet:
        for (std::string_view key : req.keys) {
          std::optional<std::string> v = engine_->Get(str(key));
          AppendBytes(&conn.out, v ? *v : std::string());
        }
        return;
      case Op::kMultiSet:
        for (std::size_t i = 0; i < req.keys.size(); ++i) {
          absl::Status st = engine_->Set(str(req.keys[i]), str(req.values[i]));
          if (!st.ok()) {
            Close(conn, std::string(st.message()));
            return;
          }
        }
        return;
      case Op::kCancelWait: {
        std::map<std::uint64_t, KvEngine::WaiterId> waits;
        waits.swap(conn.waits);
        for (auto& [token, waiter] : waits) {
          if (waiter != 0) engine_->Cancel(waiter, absl::CancelledError("cancelled by the client"));
        }
        AppendValue<std::uint8_t>(&conn.out, kWaitCanceled);
        return;
      }
      case Op::kWatchKey:
        Close(conn,
              "WATCH_KEY (TCPStore.watch_key of torch 1.x) is not supported by ddprun's store");
        return;
      case Op::kQueuePush:
      case Op::kQueuePop:
      case Op::kQueueLen:
        Close(conn, absl::StrCat(OpName(req.op),
                                 " (TCPStore queues) is not supported by ddprun's store"));
        return;
      case Op::kUnknown:
        Close(conn, "unknown query type");
        return;
    }
  }

  const int listen_fd_;
  // done_mu_ guards done_ and wake_fd_ (closed and set to -1 on shutdown).
  std::mutex done_mu_;
  std::vector<Completion> done_;
  int wake_fd_;
  const int port_;
  std::atomic<bool> stop_{false};
  // Owned by the loop thread (and by the destructor after the join).
  std::unordered_map<std::uint64_t, Connection> conns_;
  std::uint64_t next_conn_id_ = 1;
  // Declared after done_ so that it is destroyed first: its destructor cancels
  // outstanding waiters, whose callbacks touch done_.
  std::unique_ptr<KvEngine> engine_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// C10dStoreServer

absl::StatusOr<std::unique_ptr<C10dStoreServer>> C10dStoreServer::Start(
    const C10dStoreServerOptions& opts) {
  const std::string where = absl::StrCat(opts.host, ":", opts.port);
  if (opts.port < 0 || opts.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("cannot bind the TCPStore on ", where,
                                                   ": the port is out of range; use 0..65535"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(opts.port);
  int gai = ::getaddrinfo(opts.host.empty() ? nullptr : opts.host.c_str(), port_str.c_str(), &hints,
                          &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot bind the TCPStore on ", where, ": ",
                                                   ::gai_strerror(gai),
                                                   "; use a local address such as 0.0.0.0"));
  }
  int listen_fd = -1;
  int last_errno = 0;
  for (addrinfo* ai = res; ai != nullptr && listen_fd < 0; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last_errno = errno;
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(res);
  if (listen_fd < 0) {
    if (last_errno == EADDRINUSE) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot bind the TCPStore on ", where,
                       ": address already in use; choose another --master_port or stop the "
                       "process that holds it"));
    }
    if (last_errno == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot bind the TCPStore on ", where,
                       ": permission denied; use a port above 1023 for --master_port"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot bind the TCPStore on ", where, ": ", std::strerror(last_errno),
                     "; check that --master_addr is an address of this host"));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = 0;
  if (bound.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  } else if (bound.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  }
  int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    const int err = errno;
    ::close(listen_fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the TCPStore: eventfd failed: ", std::strerror(err),
                     "; raise the open-file limit (ulimit -n)"));
  }
  auto impl = std::make_unique<Impl>(listen_fd, wake_fd, port);
  impl->Start();
  return std::unique_ptr<C10dStoreServer>(new C10dStoreServer(std::move(impl)));
}

C10dStoreServer::C10dStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
C10dStoreServer::~C10dStoreServer() = default;
int C10dStoreServer::port() const { return impl_->port(); }
KvEngine& C10dStoreServer::engine() { return impl_->engine(); }

// ---------------------------------------------------------------------------
// C10dStoreClient: blocking calls over a non-blocking socket, every wait bounded.

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr std::chrono::seconds kReplyTimeout{60};

constexpr std::uint8_t kModernValidate = 0;
constexpr std::uint8_t kModernSet = 1;
constexpr std::uint8_t kModernGet = 3;
constexpr std::uint8_t kModernAdd = 4;
constexpr std::uint8_t kModernWait = 6;
constexpr std::uint8_t kModernCancelWait = 12;
constexpr std::uint8_t kModernPing = 13;

int MillisLeft(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on fd until the deadline. Returns 1 ready, 0 timeout, -1 error.
int PollFor(int fd, short events, SteadyClock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, MillisLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return -1;
    return rc == 0 ? 0 : 1;
  }
}

absl::Status SendAll(int fd, std::string_view data, SteadyClock::time_point deadline) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = PollFor(fd, POLLOUT, deadline);
      if (rc == 0) {
        return absl::DeadlineExceededError(
            "timed out sending to the TCPStore; the store server is not reading");
      }
      if (rc > 0) continue;
    }
    return absl::UnavailableError(
        absl::StrCat("lost the connection to the TCPStore: ", std::strerror(errno),
                     "; the store server may have stopped"));
  }
  return absl::OkStatus();
}

// Reads exactly n bytes. Returns DeadlineExceeded if the deadline passes first.
absl::Status RecvExact(int fd, char* buf, std::size_t n, SteadyClock::time_point deadline) {
  std::size_t off = 0;
  while (off < n) {
    ssize_t got = ::recv(fd, buf + off, n - off, 0);
    if (got > 0) {
      off += got;
      continue;
    }
    if (got == 0) {
      return absl::UnavailableError(
          "the TCPStore closed the connection; the store server stopped or rejected a request");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = PollFor(fd, POLLIN, deadline);
      if (rc == 0) {
        return absl::DeadlineExceededError("timed out waiting for a reply from the TCPStore");
      }
      if (rc > 0) continue;
    }
    return absl::UnavailableError(
        absl::StrCat("lost the connection to the TCPStore: ", std::strerror(errno),
                     "; the store server may have stopped"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> RecvValue(int fd, SteadyClock::time_point deadline) {
  T v{};
  DDPRUN_RETURN_IF_ERROR(RecvExact(fd, reinterpret_cast<char*>(&v), sizeof(T), deadline));
  return v;
}

// Connects to one address; returns the fd or -1 with *err set.
int ConnectOne(const addrinfo* ai, SteadyClock::time_point deadline, std::string* err) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *err = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *err = std::strerror(errno);
      ::close(fd);
      return -1;
    }
    int rc = PollFor(fd, POLLOUT, deadline);
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (rc <= 0) {
      *err = rc == 0 ? "connect timed out" : std::strerror(errno);
      ::close(fd);
      return -1;
    }
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = std::strerror(so_error);
      ::close(fd);
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// The torch 2.x handshake: VALIDATE with the magic, then a PING round trip.
absl::Status Handshake(int fd, SteadyClock::time_point deadline) {
  std::string msg;
  AppendValue<std::uint8_t>(&msg, kModernValidate);
  AppendValue<std::uint32_t>(&msg, kValidationMagic);
  const std::uint32_t nonce = static_cast<std::uint32_t>(::getpid());
  AppendValue<std::uint8_t>(&msg, kModernPing);
  AppendValue<std::uint32_t>(&msg, nonce);
  DDPRUN_RETURN_IF_ERROR(SendAll(fd, msg, deadline));
  absl::StatusOr<std::uint32_t> echo = RecvValue<std::uint32_t>(fd, deadline);
  if (!echo.ok()) return echo.status();
  if (*echo != nonce) {
    return absl::UnavailableError(
        "the TCPStore answered PING with a wrong nonce; the port is not a c10d TCPStore");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<C10dStoreClient>> C10dStoreClient::Connect(const std::string& host,
                                                                          int port,
                                                                          double timeout_s) {
  const std::string where = absl::StrCat(host, ":", port);
  const auto start = SteadyClock::now();
  const auto deadline = start + std::chrono::duration_cast<SteadyClock::duration>(
                                    std::chrono::duration<double>(std::max(0.0, timeout_s)));
  std::string last_error = "no attempt was made";
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port_str = std::to_string(port);
    int gai = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        // Each attempt gets at least a few seconds, even past a short deadline.
        const auto attempt_deadline =
            std::max(deadline, SteadyClock::now() + std::chrono::seconds(5));
        int fd = ConnectOne(ai, attempt_deadline, &last_error);
        if (fd < 0) continue;
        absl::Status st = Handshake(fd, attempt_deadline);
        if (st.ok()) {
          ::freeaddrinfo(res);
          return std::unique_ptr<C10dStoreClient>(new C10dStoreClient(fd));
        }
        last_error = std::string(st.message());
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (SteadyClock::now() >= deadline) break;
    std::this_thread::sleep_for(
        std::min<SteadyClock::duration>(backoff, deadline - SteadyClock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot connect to the TCPStore at ", where, " within ", timeout_s, "s: ", last_error,
      "; check that the store is running and that --master_addr/--master_port are right"));
}

C10dStoreClient::C10dStoreClient(int fd) : fd_(fd) {}

C10dStoreClient::~C10dStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status C10dStoreClient::Set(const std::string& key, const std::string& value) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store value of ", value.size(), " bytes exceeds the limit of ", kMaxValueBytes,
        " bytes; store large data elsewhere and put its path in the store"));
  }
  std::string msg;
  AppendValue<std::uint8_t>(&msg, kModernSet);
  AppendBytes(&msg, key);
  AppendBytes(&msg, value);
  return SendAll(fd_, msg, SteadyClock::now() + kReplyTimeout);
}

absl::StatusOr<std::string> C10dStoreClient::Get(const std::string& key, double timeout_s) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  std::string msg;
  AppendValue<std::uint8_t>(&msg, kModernWait);
  AppendValue<std::uint64_t>(&msg, 1);
  AppendBytes(&msg, key);
  DDPRUN_RETURN_IF_ERROR(SendAll(fd_, msg, SteadyClock::now() + kReplyTimeout));
  const auto wait_deadline =
      SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                               std::chrono::duration<double>(std::max(0.0, timeout_s)));
  absl::StatusOr<std::uint8_t> reply = RecvValue<std::uint8_t>(fd_, wait_deadline);
  if (!reply.ok() && absl::IsDeadlineExceeded(reply.status())) {
    // Cancel; the server answers WAIT_CANCELED, possibly after a late STOP_WAITING.
    std::string cancel;
    AppendValue<std::uint8_t>(&cancel, kModernCancelWait);
    DDPRUN_RETURN_IF_ERROR(SendAll(fd_, cancel, SteadyClock::now() + kReplyTimeout));
    absl::StatusOr<std::uint8_t> ack =
        RecvValue<std::uint8_t>(fd_, SteadyClock::now() + kReplyTimeout);
    if (!ack.ok()) return ack.status();
    const bool arrived = *ack == kStopWaiting;
    if (arrived) {
      ack = RecvValue<std::uint8_t>(fd_, SteadyClock::now() + kReplyTimeout);
      if (!ack.ok()) return ack.status();
    }
    if (*ack != kWaitCanceled) {
      return absl::UnavailableError(
          "the TCPStore answered CANCEL_WAIT unexpectedly; the port is not a c10d TCPStore");
    }
    if (!arrived) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", timeout_s, "s waiting for store key '", key,
                       "'; the process that should set it may have failed or not started yet"));
    }
  } else if (!reply.ok()) {
    return reply.status();
  } else if (*reply != kStopWaiting) {
    return absl::UnavailableError(
        "the TCPStore answered WAIT unexpectedly; the port is not a c10d TCPStore");
  }
  msg.clear();
  AppendValue<std::uint8_t>(&msg, kModernGet);
  AppendBytes(&msg, key);
  const auto deadline = SteadyClock::now() + kReplyTimeout;
  DDPRUN_RETURN_IF_ERROR(SendAll(fd_, msg, deadline));
  absl::StatusOr<std::uint64_t> len = RecvValue<std::uint64_t>(fd_, deadline);
  if (!len.ok()) return len.status();
  if (*len > kMaxValueBytes) {
    return absl::UnavailableError(absl::StrCat("the TCPStore sent a value of ", *len,
                                               " bytes for key '", key, "', over the limit of ",
                                               kMaxValueBytes, " bytes"));
  }
  std::string value(*len, '\0');
  DDPRUN_RETURN_IF_ERROR(RecvExact(fd_, value.data(), value.size(), deadline));
  return value;
}

absl::StatusOr<std::int64_t> C10dStoreClient::Add(const std::string& key, std::int64_t delta) {
  DDPRUN_RETURN_IF_ERROR(KvEngine::CheckKey(key));
  std::string msg;
  AppendValue<std::uint8_t>(&msg, kModernAdd);
  AppendBytes(&msg, key);
  AppendValue<std::int64_t>(&msg, delta);
  const auto deadline = SteadyClock::now() + kReplyTimeout;
  DDPRUN_RETURN_IF_ERROR(SendAll(fd_, msg, deadline));
  return RecvValue<std::int64_t>(fd_, deadline);
}

}  // namespace ddprun::rendezvous
