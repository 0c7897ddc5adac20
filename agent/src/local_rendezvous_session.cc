// The single-node session: the rendezvous of a job that can only ever have
// this node (embedded mode, --nnodes=1) runs in this process, and the agent
// calls its JobTable directly instead of through a gRPC client and server.
//
// What stays reachable from outside, as with the gRPC session: the endpoint
// (DDPRUN_STORE_ADDR, `ddprun status`, `ddprun top`) is a TCP socket bound
// and listening from Open() on. Nothing serves it until a client connects:
// then a thread that waits on the socket loads the gRPC module
// (grpc_module.h) and hands it this table, its metrics hub and every accepted
// connection. A job whose workers never speak to the rendezvous (a PyTorch job
// reaches only its TCPStore) never loads gRPC.
//
// Monitoring as with the embedded gRPC server (docs/monitoring.md): the table
// reports to an in-process MetricsHub, which this agent's reporter thread
// feeds (ReportMetrics, a direct call), a ticker thread ticks once a second
// (series, hang deadlines; a hang's --on_hang is applied to the table), and
// the dashboard's HTTP port (Beast, no gRPC) serves from Open() on, printing
// the same URL line.
//
// TLS: a job given --tls_* files does not run here (RunsRendezvousInProcess
// is false); it takes the gRPC session, whose server speaks TLS from its
// first byte. So the lazily started gRPC serving is always plaintext.
//
// Threads: the agent's main thread calls every method but ReportMetrics (the
// reporter thread). The acceptor, ticker and HTTP threads start in Open();
// the table's DeadlineTimer starts on the table's first deadline still pending
// after the change that made it (a one-node round never needs it). Events
// reach the agent's queue from whichever thread changed the table (the main
// thread, the timer, the ticker applying --on_hang, a gRPC thread serving a
// remote Report).
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/grpc_module.h"
#include "ddprun/agent/host.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/common/deadline_timer.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/hang_action.h"
#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/hub_ticker.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "ddprun/rendezvous/store/sdk_store_scope.h"
#include "round_store.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using rdzv::Duration;
using rdzv::TimePoint;

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// One Join "stream": the table's events for it go to the agent's queue until
// the agent ends it.
class LocalSink final : public rdzv::EventSink {
 public:
  LocalSink(std::uint64_t id, EventQueue* events) : id_(id), events_(events) {}

  void Bind(const std::string& job_id, const std::string& node_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    job_id_ = job_id;
    node_id_ = node_id;
  }
  void Deliver(rdzv::RoundEvent event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (events_ == nullptr) return;  // ended by the agent: stale
    if (!std::holds_alternative<rdzv::Assignment>(event)) terminal_ = true;
    events_->Push(StreamEvent{id_, std::move(event)});
  }

  // Stops deliveries; tells the table how the stream ended, as the gRPC
  // server's reactor does (a stream cut before its terminal event lost its
  // node).
  void End(rdzv::JobTable& table) {
    std::string job, node;
    bool clean;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_ = nullptr;
      job = job_id_;
      node = node_id_;
      clean = terminal_;
    }
    if (node.empty()) return;
    if (clean) {
      table.Unregister(job, node, this);
    } else {
      table.StreamLost(job, node, this);
    }
  }

 private:
  const std::uint64_t id_;
  std::mutex mu_;
  EventQueue* events_;
  std::string job_id_, node_id_;
  bool terminal_ = false;
};

class LocalRendezvousSession final : public RendezvousSession {
 public:
  LocalRendezvousSession(const AgentOptions& options, const rdzv::Clock& clock)
      : options_(options), clock_(clock) {
    rdzv::MetricsHubOptions ho;
    ho.clock = &clock_;
    ho.act = [this](const std::string& job, std::int64_t round, const std::string& node,
                    rdzv::OnHang action, const rdzv::WorkerFailure& failure) {
      absl::Status st = rdzv::ApplyOnHang(*table_, job, round, node, action, failure);
      if (!st.ok() && rdzv::KindOf(st) != rdzv::ErrorKind::kState) {
        std::fprintf(stderr, "ddprun: %s\n", std::string(st.message()).c_str());
      }
    };
    hub_ = std::make_unique<rdzv::MetricsHub>(std::move(ho));
    rdzv::JobTableOptions to;
    to.clock = &clock_;
    to.observer = hub_.get();
    // The one job is kept, closed, for as long as ddprun runs: no retention
    // deadline (which started the table's timer thread at every exit).
    to.closed_job_retention = rdzv::Duration::max();
    // The table reports only deadlines still pending after a change (a
    // one-node round completes inside the Join that opened it, its join
    // timeout with it), so the timer's thread starts for a real wait only.
    to.on_deadline = [this](TimePoint t) { Timer().Notify(t); };
    table_ = std::make_unique<rdzv::JobTable>(std::move(to));
  }
  ~LocalRendezvousSession() override { Close(); }

  absl::Status Open(TimePoint, const std::function<bool()>&) override {
    // Once per process, before any store starts: the workers' store holds two
    // connections per worker, up to the hard open-file limit.
    rdzv::RaiseOpenFileLimit();
    const std::string bind = options_.rdzv_host.empty() ? "0.0.0.0" : options_.rdzv_host;
    if (absl::Status st = Listen(bind, options_.rdzv_port); !st.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot host the rendezvous on ", rdzv::FormatHostPort(bind, options_.rdzv_port), ": ",
          st.message(), "; pick a free port or another --rdzv_endpoint"));
    }
    connect_host_ = IsWildcard(bind) ? "127.0.0.1" : bind;
    DDPRUN_RETURN_IF_ERROR(StartDashboard(bind));
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
    DDPRUN_DEBUG_LOG(kAgent) << "hosting the rendezvous in process on "
                             << rdzv::FormatHostPort(connect_host_, port_);
    return absl::OkStatus();
  }

  absl::Status PrepareRound() override {
    std::lock_guard<std::mutex> lock(store_mu_);  // StoreWaitedKeys reads it
    store_server_.reset();  // the old round's store closes first (round_store.h)
    DDPRUN_ASSIGN_OR_RETURN(store_server_, StartRoundStore());
    master_port_ = store_server_->port();
    return absl::OkStatus();
  }

  // SDK workers bootstrap through the round's TCPStore, so that a job of SDK
  // workers never loads gRPC here (docs/sdk.md, "Which store").
  absl::StatusOr<std::string> OpenSdkStore(const rdzv::Assignment& a) override {
    if (!store_server_) return std::string();
    DDPRUN_RETURN_IF_ERROR(
        store_server_->engine().Set(rdzv::SdkStoreJobKey(a.store_token, a.round),
                                    a.job_id.empty() ? options_.job_id : a.job_id));
    return rdzv::FormatHostPort("127.0.0.1", master_port_);
  }

  // The dashboard's I/O thread, the acceptor and the hub's ticker start once
  // the first round's workers have run for a moment (rendezvous_session.h),
  // not on the way to the first spawn.
  void WorkersStarted() override {
    if (http_) http_->Serve();
    if (acceptor_.joinable() || listen_fd_ < 0 || wake_fd_ < 0) return;
    acceptor_ = std::thread([this] { AcceptLoop(); });
    ticker_ = std::make_unique<rdzv::HubTicker>(hub_.get());
  }

  int master_port() const override { return master_port_; }
  std::string endpoint() const override { return rdzv::FormatHostPort(connect_host_, port_); }
  std::string advertised_host() const override {
    if (!options_.local_addr.empty()) return options_.local_addr;
    if (connect_host_ == "localhost" || connect_host_ == "::1" ||
        connect_host_.rfind("127.", 0) == 0) {
      return "127.0.0.1";
    }
    return Hostname();
  }
  bool hosts_rendezvous() const override { return true; }

  std::uint64_t Join(const rdzv::JoinSpec& spec, EventQueue& events) override {
    EndJoin();
    const std::uint64_t id = ++stream_id_;
    sink_ = std::make_shared<LocalSink>(id, &events);
    auto node = table_->Join(spec, sink_);
    if (!node.ok()) events.Push(StreamEvent{id, node.status()});
    return id;
  }

  void EndJoin() override {
    if (sink_) sink_->End(*table_);
    sink_.reset();
  }

  absl::Status WaitForConnected(Duration) override { return absl::OkStatus(); }

  absl::Status Report(const rdzv::Assignment& a, rdzv::Outcome outcome,
                      const std::vector<rdzv::WorkerFailure>& failures, Duration) override {
    return table_->Report(options_.job_id, a.node_id, a.round, outcome, failures);
  }

  std::vector<std::string> StoreWaitedKeys(std::size_t max) override {
    std::lock_guard<std::mutex> lock(store_mu_);
    return store_server_ ? store_server_->engine().WaitedKeys(max) : std::vector<std::string>{};
  }

  absl::StatusOr<rdzv::MetricsReply> ReportMetrics(const rdzv::MetricsReport& report,
                                                   Duration) override {
    return hub_->Report(report);
  }

  absl::StatusOr<rdzv::JobStatus> JobStatus(Duration) override {
    for (rdzv::JobStatus& j : table_->Status(options_.job_id))
      if (j.job_id == options_.job_id) return std::move(j);
    return absl::NotFoundError(absl::StrCat("the rendezvous does not know job ", options_.job_id));
  }

  // The job can only ever be this node: besides the workers (gone by now),
  // only a `ddprun status` or `top` client, or a browser on the dashboard,
  // reaches the session. A gRPC client that the acceptor took (it may be
  // loading the gRPC module for it) gets the orderly Close(); the rest (the
  // dashboard's connections, the store's, the ticker's thread) is left to
  // Close() or to the process's end.
  void Leave() override {
    EndJoin();
    if (client_seen_.load(std::memory_order_acquire)) Close();
  }

  void Close() override {
    EndJoin();
    if (ticker_) ticker_->Stop();
    if (http_) http_->Stop();
    if (acceptor_.joinable()) {
      const std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
      acceptor_.join();
    }
    // The table first: it ends open streams and store waits, so that the
    // server's calls finish before the server shuts down (grpc_module.h).
    table_->Shutdown();
    if (served_) served_->Shutdown();
    served_.reset();
    {
      std::lock_guard<std::mutex> lock(timer_mu_);
      if (timer_) timer_->Stop();
    }
    {
      std::lock_guard<std::mutex> lock(store_mu_);
      store_server_.reset();
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
  }

 private:
  void Log(const std::string& msg) const {
    std::string line = absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, 0), msg, "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }

  // The monitoring HTTP port (--dashboard_port; -1 off), on the rendezvous's
  // bind address, and the line that names it, as the embedded gRPC server's
  // (grpc_rendezvous_session.cc).
  absl::Status StartDashboard(const std::string& bind) {
    if (options_.dashboard_port < 0) return absl::OkStatus();
    rdzv::HttpServerOptions ho;
    ho.host = bind;
    ho.port = options_.dashboard_port;
    ho.listen_fix = "pick another --dashboard_port, or --dashboard_port=off";
    ho.defer_serving = true;  // served from WorkersStarted()
    const rdzv::MetricsHub* hub = hub_.get();
    rdzv::HttpHandler handler = [hub](const std::string& target) {
      return rdzv::ServeMonitoring(*hub, target);
    };
    // A web configuration (HTTPS, basic auth) is served by the gRPC module,
    // which links OpenSSL; a plain port needs neither (grpc_module.h).
    std::string served;
    const bool secured = !options_.web_config.empty();
    absl::StatusOr<std::unique_ptr<rdzv::HttpServer>> http = absl::UnknownError("");
    if (secured) {
      DDPRUN_ASSIGN_OR_RETURN(const GrpcModule* module, LoadGrpcModule());
      http = module->start_monitoring_server(ho, options_.web_config, options_.web_config_source,
                                             std::move(handler), &served);
    } else {
      http = rdzv::HttpServer::Start(ho, std::move(handler));
    }
    if (!http.ok()) {
      // Bad input (the flag names a port in use): kind kBadInput, as the server's.
      return absl::InvalidArgumentError("dashboard: " + std::string(http.status().message()));
    }
    http_ = std::move(*http);
    const std::string shown =
        IsWildcard(bind) ? (options_.local_addr.empty() ? Hostname() : options_.local_addr) : bind;
    if (secured) Log("the monitoring port serves " + served);
    Log(absl::StrCat("dashboard at ", secured ? "https://" : "http://",
                     rdzv::FormatHostPort(shown, http_->port()),
                     "/ (Prometheus: /metrics; in a terminal: ddprun top --rdzv_endpoint ",
                     rdzv::FormatHostPort(shown, port_), " --job ", options_.job_id, ")"));
    return absl::OkStatus();
  }

  // The table's timer, started on its first pending deadline.
  rdzv::DeadlineTimer& Timer() {
    std::lock_guard<std::mutex> lock(timer_mu_);
    if (!timer_) {
      timer_ = std::make_unique<rdzv::DeadlineTimer>(
          clock_, [this] { return table_->NextDeadline(); }, [this] { table_->Tick(); });
    }
    return *timer_;
  }

  absl::Status Listen(const std::string& host, int port) {
    std::string h = host;
    if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    struct addrinfo hints {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    struct addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &res); rc != 0) {
      return absl::InvalidArgumentError(::gai_strerror(rc));
    }
    std::string why = "no address";
    for (struct addrinfo* r = res; r != nullptr; r = r->ai_next) {
      const int fd = ::socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
      if (fd < 0) continue;
      const int on = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
      if (::bind(fd, r->ai_addr, r->ai_addrlen) == 0 && ::listen(fd, 4096) == 0) {
        sockaddr_storage sa{};
        socklen_t len = sizeof(sa);
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
        port_ = ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
        listen_fd_ = fd;
        break;
      }
      why = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (listen_fd_ < 0) {
      for (char& c : why) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return absl::UnavailableError(why);
    }
    return absl::OkStatus();
  }

  // Waits for connections; the first one loads the gRPC module and starts
  // serving the table. Ends when Close() signals wake_fd_.
  void AcceptLoop() {
    bool failed = false;  // the module could not be loaded: said once
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      // Non-blocking, as gRPC's own listener accepts them: gRPC's endpoint
      // reads until EAGAIN, and a blocking descriptor handed over stalls one
      // of its event threads in read(), which delays every connection's ping
      // acks (clients then fail with "keepalive watchdog timeout").
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          ::poll(nullptr, 0, 10);  // out of descriptors: do not spin
        }
        continue;
      }
      client_seen_.store(true, std::memory_order_release);
      if (!served_ && !failed) {
        absl::StatusOr<std::unique_ptr<ServedTable>> served =
            absl::FailedPreconditionError("not loaded");
        absl::StatusOr<const GrpcModule*> module = LoadGrpcModule();
        if (module.ok()) served = (*module)->serve_table(*table_, *hub_, port_);
        if (served.ok()) {
          served_ = std::move(*served);
          DDPRUN_DEBUG_LOG(kAgent) << "a client connected: serving the rendezvous over gRPC";
        } else {
          failed = true;
          const absl::Status& st = module.ok() ? served.status() : module.status();
          std::string line =
              absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, 0),
                           "cannot serve the rendezvous to a client: ", st.message(), "\n");
          std::fputs(line.c_str(), stderr);
        }
      }
      if (served_) {
        served_->HandOver(fd);
      } else {
        ::close(fd);
      }
    }
  }

  const AgentOptions options_;
  const rdzv::Clock& clock_;
  std::unique_ptr<rdzv::MetricsHub> hub_;  // before the table, which reports to it
  std::unique_ptr<rdzv::JobTable> table_;
  std::mutex timer_mu_;
  std::unique_ptr<rdzv::DeadlineTimer> timer_;

  std::unique_ptr<rdzv::HttpServer> http_;   // the dashboard; null when off
  std::unique_ptr<rdzv::HubTicker> ticker_;  // the hub's clock (hub_ticker.h)

  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::string connect_host_ = "127.0.0.1";
  std::thread acceptor_;
  std::unique_ptr<ServedTable> served_;   // the acceptor's; read after it ends
  std::atomic<bool> client_seen_{false};  // the acceptor took a connection

  std::mutex store_mu_;  // guards store_server_ for StoreWaitedKeys (reporter thread)
  std::unique_ptr<rdzv::C10dStoreServer> store_server_;
  int master_port_ = 0;

  std::shared_ptr<LocalSink> sink_;
  std::uint64_t stream_id_ = 0;
};

// A session whose every call fails with why the real one could not be made.
class UnavailableSession final : public RendezvousSession {
 public:
  explicit UnavailableSession(absl::Status why) : why_(std::move(why)) {}
  absl::Status Open(TimePoint, const std::function<bool()>&) override { return why_; }
  absl::Status PrepareRound() override { return why_; }
  int master_port() const override { return 0; }
  std::string endpoint() const override { return ""; }
  std::string advertised_host() const override { return ""; }
  bool hosts_rendezvous() const override { return false; }
  std::uint64_t Join(const rdzv::JoinSpec&, EventQueue& events) override {
    events.Push(StreamEvent{1, why_});
    return 1;
  }
  void EndJoin() override {}
  absl::Status WaitForConnected(Duration) override { return why_; }
  absl::Status Report(const rdzv::Assignment&, rdzv::Outcome,
                      const std::vector<rdzv::WorkerFailure>&, Duration) override {
    return why_;
  }
  absl::StatusOr<rdzv::JobStatus> JobStatus(Duration) override { return why_; }
  void Close() override {}

 private:
  absl::Status why_;
};

}  // namespace

bool RunsRendezvousInProcess(const AgentOptions& options) {
  const rendezvous::TlsOptions& tls = options.tls;
  const bool plaintext = tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty();
  return options.mode == RendezvousMode::kEmbedded && options.max_nodes == 1 && plaintext;
}

std::unique_ptr<RendezvousSession> MakeLocalRendezvousSession(const AgentOptions& options,
                                                              const rendezvous::Clock& clock) {
  return std::make_unique<LocalRendezvousSession>(options, clock);
}

std::unique_ptr<RendezvousSession> MakeRendezvousSession(const AgentOptions& options,
                                                         const rendezvous::Clock& clock) {
  if (RunsRendezvousInProcess(options)) return MakeLocalRendezvousSession(options, clock);
  absl::StatusOr<const GrpcModule*> module = LoadGrpcModule();
  if (!module.ok()) return std::make_unique<UnavailableSession>(module.status());
  return (*module)->make_session(options, clock);
}

}  // namespace ddprun::agent
