// The TCPStore server loop: sockets and connections here, the wire in
// c10d_wire.cc, the semantics in c10d_store_handler.cc, the data in KvEngine.
#include "ddprun/rendezvous/store/c10d_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
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
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/store/c10d_store_handler.h"
#include "ddprun/rendezvous/store/c10d_wire.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {
namespace {

// A client whose unread replies exceed this is not read from until it drains;
// past kMaxPendingOutputBytes it is disconnected.
constexpr std::size_t kOutputHighWater = 4u << 20;
constexpr std::size_t kMaxPendingOutputBytes = 64u << 20;
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
  Impl(net::UniqueFd listen_fd, net::UniqueFd epoll_fd, int wake_fd, int port)
      : listen_fd_(std::move(listen_fd)),
        epoll_fd_(std::move(epoll_fd)),
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
    std::uint32_t interest = 0;  // the events epoll watches for
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

  // Level-triggered epoll: a connection's interest (in_mask) is EPOLLIN while
  // it may send (not at EOF, replies below the high-water mark) and EPOLLOUT
  // while replies are pending; it is updated only when it changes. Work per
  // round is proportional to the ready and touched connections, never to all.
  void Run() {
    constexpr std::uint64_t kWakeTag = 0;
    constexpr std::uint64_t kListenTag = 1;  // connection ids start at 2
    if (!AddToEpoll(wake_fd_, EPOLLIN, kWakeTag) || !SetListening(true)) return;
    std::vector<epoll_event> events(1024);
    while (!stop_.load()) {
      const int n =
          ::epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        LogLine(
            absl::StrCat("epoll_wait failed: ", std::strerror(errno), "; the store stops serving"));
        return;
      }
      touched_.clear();
      for (int i = 0; i < n; ++i) {
        const std::uint64_t tag = events[i].data.u64;
        const std::uint32_t rev = events[i].events;
        if (tag == kWakeTag) {
          std::uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof(v));
          if (stop_.load()) return;
          continue;
        }
        if (tag == kListenTag) {
          AcceptAll();
          continue;
        }
        auto it = conns_.find(tag);
        if (it == conns_.end()) continue;
        Connection& conn = it->second;
        if (rev & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadFrom(conn);
        if (!conn.dead) Process(conn);
        if (!conn.dead && (rev & EPOLLOUT)) Flush(conn);
        touched_.push_back(tag);
      }
      ProcessCompletions();
      for (const std::uint64_t id : touched_) {
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;
        Connection& conn = it->second;
        // A client that closed its end has had its buffered requests served;
        // its replies cannot be delivered once it is gone, so drop it.
        if (conn.dead || (conn.eof && conn.session.out.size() == conn.out_off)) {
          DropConnection(conn);
          conns_.erase(it);
          if (!listening_) SetListening(true);  // a descriptor is free again
        } else {
          UpdateInterest(conn);
        }
      }
    }
  }

  bool AddToEpoll(int fd, std::uint32_t events, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) == 0) return true;
    LogLine(absl::StrCat("epoll_ctl failed: ", std::strerror(errno), "; the store stops serving"));
    return false;
  }

  // Accepting stops while the open-file limit is reached (a level-triggered
  // listening socket would otherwise spin) and resumes when a client leaves.
  bool SetListening(bool on) {
    epoll_event ev{};
    ev.events = on ? static_cast<std::uint32_t>(EPOLLIN) : 0u;
    ev.data.u64 = 1;
    const int op = listen_registered_ ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (::epoll_ctl(epoll_fd_.get(), op, listen_fd_.get(), &ev) != 0) {
      LogLine(absl::StrCat("epoll_ctl failed on the listening socket: ", std::strerror(errno)));
      return false;
    }
    listen_registered_ = true;
    listening_ = on;
    return true;
  }

  static std::uint32_t WantedEvents(const Connection& conn) {
    std::uint32_t events = 0;
    const std::size_t pending = conn.session.out.size() - conn.out_off;
    if (!conn.eof && pending < kOutputHighWater) events |= EPOLLIN;
    if (pending > 0) events |= EPOLLOUT;
    return events;
  }

  void UpdateInterest(Connection& conn) {
    const std::uint32_t want = WantedEvents(conn);
    if (want == conn.interest) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = conn.id;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, conn.fd.get(), &ev) != 0) {
      Close(conn, absl::StrCat("epoll_ctl failed: ", std::strerror(errno)));
      touched_.push_back(conn.id);  // dropped at the end of this round
      return;
    }
    conn.interest = want;
  }

  void AcceptAll() {
    for (;;) {
      std::string peer;
      net::UniqueFd fd = net::AcceptOne(listen_fd_.get(), &peer);
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          LogProtocolError(absl::StrCat(
              "cannot accept more clients: the open-file limit is reached with ", conns_.size(),
              " connected; raise it with ulimit -n (each torch 1.13 worker opens two "
              "connections)"));
          SetListening(false);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
          LogLine(absl::StrCat("accept failed: ", std::strerror(errno)));
        }
        return;
      }
      const std::uint64_t id = next_conn_id_++;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
        LogProtocolError(
            absl::StrCat("cannot watch the connection from ", peer, ": ", std::strerror(errno)));
        continue;  // fd closes here
      }
      Connection& conn = conns_[id];
      conn.id = id;
      conn.fd = std::move(fd);
      conn.peer = std::move(peer);
      conn.interest = EPOLLIN;
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
      touched_.push_back(c.conn_id);  // its interest (EPOLLOUT) is updated after
      const absl::Status st = handler_.OnWaitDone(&conn.session, c.token, c.status);
      if (!st.ok()) {
        Close(conn, std::string(st.message()));
      } else if (conn.session.out.size() > conn.out_off) {
        Flush(conn);
      }
    }
  }

  net::UniqueFd listen_fd_;
  net::UniqueFd epoll_fd_;
  // done_mu_ guards done_ and wake_fd_ (closed and set to -1 on shutdown).
  std::mutex done_mu_;
  std::vector<Completion> done_;
  int wake_fd_;
  const int port_;
  std::atomic<bool> stop_{false};
  // Owned by the loop thread (and by the destructor after the join).
  std::unordered_map<std::uint64_t, Connection> conns_;
  std::uint64_t next_conn_id_ = 2;      // 0 and 1 tag the wake fd and the listener
  std::vector<std::uint64_t> touched_;  // connections served this round
  bool listen_registered_ = false;
  bool listening_ = false;
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
  net::UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) {
    const int err = errno;
    ::close(wake_fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the TCPStore: epoll_create1 failed: ", std::strerror(err),
                     "; raise the open-file limit (ulimit -n)"));
  }
  auto impl = std::make_unique<Impl>(*std::move(listening), std::move(epoll_fd), wake_fd, port);
  impl->Start();
  DDPRUN_DEBUG_LOG(kStore) << "serving the TCPStore on " << FormatHostPort(opts.host, port);
  return std::unique_ptr<C10dStoreServer>(new C10dStoreServer(std::move(impl)));
}

C10dStoreServer::C10dStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
C10dStoreServer::~C10dStoreServer() = default;
int C10dStoreServer::port() const { return impl_->port(); }
KvEngine& C10dStoreServer::engine() { return impl_->engine(); }

std::uint64_t RaiseOpenFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return static_cast<std::uint64_t>(rl.rlim_cur);
}

std::string StoreCapacityWarning(std::int64_t workers, std::uint64_t open_file_limit) {
  if (workers <= 0) return "";
  const std::uint64_t need =
      static_cast<std::uint64_t>(workers) * kStoreConnectionsPerWorker + kStoreReservedFiles;
  if (need <= open_file_limit) return "";
  return absl::StrCat("warning: the workers' TCPStore needs ", need, " open files for ", workers,
                      " workers (", kStoreConnectionsPerWorker,
                      " connections each with torch 1.13) but this process may open ",
                      open_file_limit, "; raise it with `ulimit -n ", need,
                      "` (and the hard limit) before starting ddprun, or workers will hang at "
                      "init_process_group");
}

}  // namespace ddprun::rendezvous
