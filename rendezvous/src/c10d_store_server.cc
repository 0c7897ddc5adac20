// The TCPStore server loop: sockets and connections here, the wire in
// c10d_wire.cc, the semantics in c10d_store_handler.cc, the data in KvEngine.
#include "ddprun/rendezvous/c10d_store_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
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
#include "ddprun/rendezvous/c10d_store_handler.h"
#include "ddprun/rendezvous/c10d_wire.h"
#include "ddprun/rendezvous/debug_log.h"
#include "ddprun/rendezvous/errors.h"
#include "ddprun/rendezvous/host_port.h"
#include "ddprun/rendezvous/kv_engine.h"
#include "socket_util.h"

namespace ddprun::rendezvous {
namespace {

// A client whose unread replies exceed this is not read from until it drains;
// past kMaxPendingOutputBytes it is disconnected.
constexpr std::size_t kOutputHighWater = 4u << 20;
constexpr std::size_t kMaxPendingOutputBytes = 64u << 20;
constexpr std::size_t kMaxConnections = 16384;
// Per poll round, read at most this much from one client (fairness).
constexpr std::size_t kMaxReadPerRound = 1u << 20;

// Logs one line to stderr.
void LogLine(const std::string& line) {
  std::fprintf(stderr, "ddprun: c10d store: %s\n", line.c_str());
}

// Protocol errors from many clients are rate-limited.
void LogProtocolError(const std::string& line) {
  static std::atomic<std::uint64_t> count{0};
  const std::uint64_t n = count.fetch_add(1);
  if (n < 20 || n % 1000 == 0) {
    LogLine(n < 20 ? line : absl::StrCat(line, " (", n + 1, " such errors so far)"));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// C10dStoreServer::Impl

class C10dStoreServer::Impl {
 public:
  Impl(net::UniqueFd listen_fd, int wake_fd, int port)
      : listen_fd_(std::move(listen_fd)),
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
    listen_fd_.reset();
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
    net::UniqueFd fd;
    std::string peer;
    c10d::RequestDecoder decoder;
    std::string in;
    std::size_t in_need = 1;  // decode only once `in` holds this many bytes
    c10d::Session session;    // replies in session.out, parked WAITs
    std::size_t out_off = 0;  // bytes of session.out already sent
    bool eof = false;
    bool dead = false;
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
      fds.push_back(pollfd{listen_fd_.get(),
                           static_cast<short>(conns_.size() < kMaxConnections ? POLLIN : 0), 0});
      for (auto& [id, conn] : conns_) {
        short events = 0;
        if (!conn.eof && conn.session.out.size() - conn.out_off < kOutputHighWater)
          events |= POLLIN;
        if (conn.session.out.size() > conn.out_off) events |= POLLOUT;
        fds.push_back(pollfd{conn.fd.get(), events, 0});
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
        if (conn.dead || (conn.eof && conn.session.out.size() == conn.out_off)) {
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
      std::string peer;
      net::UniqueFd fd = net::AcceptOne(listen_fd_.get(), &peer);
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          LogLine(absl::StrCat("accept failed: ", std::strerror(errno)));
        }
        return;
      }
      const std::uint64_t id = next_conn_id_++;
      Connection& conn = conns_[id];
      conn.id = id;
      conn.fd = std::move(fd);
      conn.peer = std::move(peer);
      DDPRUN_DEBUG_LOG(kStore) << "accepted a connection from " << conn.peer << " on port " << port_
                               << " (" << conns_.size() << " open)";
    }
  }

  void ReadFrom(Connection& conn) {
    switch (net::ReadAvailable(conn.fd.get(), &conn.in, kMaxReadPerRound)) {
      case net::IoState::kOpen:
        return;
      case net::IoState::kEof:
        conn.eof = true;
        return;
      case net::IoState::kError:  // ECONNRESET and the like: the client is gone.
        conn.eof = true;
        conn.dead = true;
        return;
    }
  }

  void Close(Connection& conn, const std::string& why) {
    LogProtocolError(absl::StrCat("closing the connection from ", conn.peer, ": ", why));
    DDPRUN_DEBUG_LOG(kStore) << "protocol error from " << conn.peer << " ("
                             << c10d::DialectName(conn.decoder.dialect()) << "): " << why;
    conn.dead = true;
  }

  void DropConnection(Connection& conn) {
    DDPRUN_DEBUG_LOG(kStore) << "connection from " << conn.peer << " closed ("
                             << (conn.dead ? "dropped" : "by the client") << ", "
                             << conn.session.waits.size() << " waits cancelled)";
    // Cancel this client's waits; their completions find no connection and are dropped.
    handler_.CancelWaits(&conn.session, absl::CancelledError("the client disconnected"));
    conn.fd.reset();
  }

  // Serves every complete request buffered on `conn`.
  void Process(Connection& conn) {
    std::size_t offset = 0;
    c10d::Request req;
    while (!conn.dead && conn.in.size() - offset >= conn.in_need) {
      const std::string_view data(conn.in.data() + offset, conn.in.size() - offset);
      const c10d::DecodeResult res = conn.decoder.Decode(data, &req);
      if (res.status == c10d::DecodeStatus::kError) {
        Close(conn, absl::StrCat("malformed request: ", res.error));
        break;
      }
      if (res.status == c10d::DecodeStatus::kNeedMore) {
        conn.in_need = res.need;
        break;
      }
      conn.in_need = 1;
      const std::uint64_t id = conn.id;
      const absl::Status st =
          handler_.Handle(req, &conn.session, [this, id](std::uint64_t token, absl::Status status) {
            OnWaitDone(id, token, std::move(status));
          });
      if (!st.ok()) Close(conn, std::string(st.message()));
      offset += res.consumed;
    }
    if (offset > 0) conn.in.erase(0, offset);
    if (!conn.dead && conn.session.out.size() > conn.out_off) Flush(conn);
  }

  void Flush(Connection& conn) {
    std::size_t sent = 0;
    const net::IoState state = net::WriteAvailable(
        conn.fd.get(), std::string_view(conn.session.out).substr(conn.out_off), &sent);
    conn.out_off += sent;
    if (state == net::IoState::kError) {
      conn.dead = true;  // EPIPE, ECONNRESET: the client is gone.
      return;
    }
    if (conn.out_off == conn.session.out.size()) {
      conn.session.out.clear();
      conn.out_off = 0;
    } else if (conn.out_off > (1u << 20)) {
      conn.session.out.erase(0, conn.out_off);
      conn.out_off = 0;
    }
    if (conn.session.out.size() - conn.out_off > kMaxPendingOutputBytes) {
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
      if (conn.dead) continue;
      const absl::Status st = handler_.OnWaitDone(&conn.session, c.token, c.status);
      if (!st.ok()) {
        Close(conn, std::string(st.message()));
      } else if (conn.session.out.size() > conn.out_off) {
        Flush(conn);
      }
    }
  }

  net::UniqueFd listen_fd_;
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
  c10d::RequestHandler handler_{engine_.get()};
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// C10dStoreServer

absl::StatusOr<std::unique_ptr<C10dStoreServer>> C10dStoreServer::Start(
    const C10dStoreServerOptions& opts) {
  const std::string where = FormatHostPort(opts.host, opts.port);
  auto fail = [&](absl::StatusCode code, absl::string_view why, absl::string_view fix) {
    return absl::Status(code,
                        absl::StrCat("cannot bind the TCPStore on ", where, ": ", why, "; ", fix));
  };
  if (opts.port < 0 || opts.port > kMaxPort) {
    return fail(absl::StatusCode::kInvalidArgument, "the port is out of range",
                absl::StrCat("use 0..", kMaxPort));
  }
  absl::StatusOr<net::UniqueFd> listening = net::ListenTcp(opts.host, opts.port);
  if (!listening.ok()) {
    const absl::Status& st = listening.status();
    switch (st.code()) {
      case absl::StatusCode::kInvalidArgument:
        return fail(st.code(), st.message(), "use a local address such as 0.0.0.0");
      case absl::StatusCode::kAlreadyExists:
        return fail(st.code(), st.message(),
                    "choose another --master_port or stop the process that holds it");
      case absl::StatusCode::kPermissionDenied:
        return fail(st.code(), st.message(), "use a port above 1023 for --master_port");
      default:
        return fail(st.code(), st.message(), "check that --master_addr is an address of this host");
    }
  }
  const int port = net::LocalPort(listening->get());
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the TCPStore: eventfd failed: ", std::strerror(errno),
                     "; raise the open-file limit (ulimit -n)"));
  }
  auto impl = std::make_unique<Impl>(*std::move(listening), wake_fd, port);
  impl->Start();
  DDPRUN_DEBUG_LOG(kStore) << "serving the TCPStore on " << FormatHostPort(opts.host, port);
  return std::unique_ptr<C10dStoreServer>(new C10dStoreServer(std::move(impl)));
}

C10dStoreServer::C10dStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
C10dStoreServer::~C10dStoreServer() = default;
int C10dStoreServer::port() const { return impl_->port(); }
KvEngine& C10dStoreServer::engine() { return impl_->engine(); }

}  // namespace ddprun::rendezvous
