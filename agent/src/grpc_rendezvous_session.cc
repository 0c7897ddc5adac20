// The real RendezvousSession: the gRPC client, and what this node serves as
// its mode says (the embedded RendezvousServer, the workers' TCPStore).
//
// Threads: the agent's main thread calls every method; one reader thread per
// Join stream turns its RoundEvents into StreamEvents on the agent's queue.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/agent/host.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/port_holder.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/common/wait_notice.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/monitoring/web_config.h"
#include "ddprun/rendezvous/monitoring/web_server.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "name_wait.h"
#include "round_store.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;
using rdzv::Duration;
using rdzv::TimePoint;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A reader's wait for the next RoundEvent; Cancel() ends it sooner.
constexpr auto kStreamWait = std::chrono::hours(24 * 365);
// How long a local endpoint is probed before this agent hosts it (kRemote).
constexpr auto kHostProbe = milliseconds(300);
// How long a port that was taken between the probe and the bind is given to
// answer as a rendezvous (another local agent that won the race to host).
constexpr auto kRaceProbe = seconds(2);
// Key under which a static node rank 0 publishes its rendezvous endpoint.
constexpr const char* kRdzvEndpointKey = "ddprun/rdzv_endpoint";
// With replicas: how long one that did not connect is tried after the others
// (about a fail-over with a 1-2 s lease; WaitForConnected).
constexpr auto kDownFor = seconds(2);
// A connect that has waited this long says so once (the wait itself lasts up
// to the join timeout, 600 s by default): no silent wait.
constexpr auto kConnectNotice = seconds(5);

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool IsAnyAddress(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// Whether `host` names this machine: a loopback or wildcard address, our
// hostname, or an address of one of our interfaces.
bool IsLocalHost(const std::string& host) {
  if (IsAnyAddress(host) || IsLoopbackHost(host) || host == Hostname()) return true;
  const std::vector<std::string> local = LocalAddresses();
  if (std::find(local.begin(), local.end(), host) != local.end()) return true;
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool found = false;
  for (struct addrinfo* r = res; r != nullptr && !found; r = r->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (r->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr, buf, sizeof(buf));
    } else if (r->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(r->ai_addr)->sin6_addr, buf,
                  sizeof(buf));
    }
    found = IsLoopbackHost(buf) || std::find(local.begin(), local.end(), buf) != local.end();
  }
  ::freeaddrinfo(res);
  return found;
}

double SecondsOf(Duration d) { return std::chrono::duration<double>(d).count(); }

class GrpcRendezvousSession final : public RendezvousSession {
 public:
  GrpcRendezvousSession(const AgentOptions& options, const rdzv::Clock& clock)
      : options_(options), clock_(clock) {}
  ~GrpcRendezvousSession() override { Close(); }

  absl::Status Open(TimePoint deadline, const std::function<bool()>& interrupted) override {
    interrupted_ = &interrupted;
    // Once per process, before any store starts: the workers' store holds two
    // connections per worker, up to the hard open-file limit.
    rdzv::RaiseOpenFileLimit();
    auto tls = rdzv::LoadClientTls(options_.tls);
    if (!tls.ok()) return tls.status();
    tls_ = *std::move(tls);
    absl::Status st = OpenByMode(deadline);
    interrupted_ = nullptr;
    return st;
  }

  absl::Status PrepareRound() override {
    if (options_.mode == RendezvousMode::kStatic) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(store_mu_);  // StoreWaitedKeys reads it
    store_server_.reset();  // the old round's store closes first (round_store.h)
    DDPRUN_ASSIGN_OR_RETURN(store_server_, StartRoundStore());
    master_port_ = store_server_->port();
    return absl::OkStatus();
  }

  int master_port() const override { return master_port_; }
  std::string endpoint() const override {
    return rdzv::FormatHostPort(connect_host_, connect_port_);
  }
  std::string advertised_host() const override {
    if (!options_.local_addr.empty()) return options_.local_addr;
    if (IsLoopbackHost(connect_host_)) return "127.0.0.1";
    return Hostname();
  }
  bool hosts_rendezvous() const override { return server_ != nullptr; }
  bool has_replicas() const override { return !options_.rdzv_replicas.empty(); }

  std::uint64_t Join(const rdzv::JoinSpec& spec, EventQueue& events) override {
    EndJoin();
    stream_ = client_->Join(spec);
    const std::uint64_t id = ++stream_id_;
    rdzv::JoinStream* stream = stream_.get();
    reader_ = std::thread([stream, id, &events] {
      while (true) {
        rdzv::RoundEvent ev = stream->Next(kStreamWait);
        // Only an Assignment keeps the stream going.
        const bool last = !std::holds_alternative<rdzv::Assignment>(ev);
        events.Push(StreamEvent{id, std::move(ev)});
        if (last) return;
      }
    });
    return id;
  }

  void EndJoin() override {
    if (stream_) stream_->Cancel();
    if (reader_.joinable()) reader_.join();
    stream_.reset();
  }

  absl::Status WaitForConnected(Duration timeout) override {
    if (!has_replicas()) return client_->WaitForConnected(timeout);
    // The replica we talked to broke or refused us (a standby): the next one,
    // then the others in turn, each for its share of the timeout.
    const auto& replicas = options_.rdzv_replicas;
    if (down_until_.size() != replicas.size()) down_until_.assign(replicas.size(), TimePoint{});
    // A dead replica refuses at once, but gRPC reports it only at the end of
    // the wait: keep each short, the caller tries again.
    const Duration slice =
        std::clamp<Duration>(timeout / replicas.size(), milliseconds(50), milliseconds(150));
    // While a standby takes over, the agent goes round the list every 100 ms
    // until one leads. A replica whose connection failed outright (refused or
    // reset: a killed ddprund) is tried only after the others for kDownFor, so
    // that it costs its slice once rather than on every round (docs/ha.md). One
    // still connecting at the end of its slice is not marked: it may be a live
    // replica on a loaded host, possibly the next leader.
    absl::Status st = absl::UnavailableError("no ddprund replica connected");
    absl::Status tls_refused;  // a replica's TLS refusal, named if none connects
    for (const bool down_pass : {false, true}) {
      for (std::size_t k = 1; k <= replicas.size(); ++k) {
        const std::size_t i = (replica_ + k) % replicas.size();
        if ((clock_.Now() < down_until_[i]) != down_pass) continue;
        auto client = rdzv::RendezvousClient::Create(replicas[i].host, replicas[i].port, tls_,
                                                     rdzv::SilenceTimeout::kFailover);
        st = client->WaitForConnected(slice);
        if (st.ok()) {
          down_until_[i] = TimePoint{};
          replica_ = i;
          client_ = std::move(client);
          connect_host_ = replicas[i].host;
          connect_port_ = replicas[i].port;
          return st;
        }
        if (rdzv::IsTlsHandshakeError(st) && tls_refused.ok()) tls_refused = st;
        if (client->ConnectFailed()) down_until_[i] = clock_.Now() + kDownFor;
      }
    }
    return tls_refused.ok() ? st : tls_refused;
  }

  absl::Status Report(const rdzv::Assignment& a, rdzv::Outcome outcome,
                      const std::vector<rdzv::WorkerFailure>& failures, Duration timeout) override {
    if (!client_) return absl::FailedPreconditionError("not connected to the rendezvous");
    return client_->Report(options_.job_id, a.node_id, a.round, outcome, failures, timeout);
  }

  absl::StatusOr<rdzv::JobStatus> JobStatus(Duration timeout) override {
    if (!client_) return absl::FailedPreconditionError("not connected to the rendezvous");
    DDPRUN_ASSIGN_OR_RETURN(std::vector<rdzv::JobStatus> jobs,
                            client_->Status(options_.job_id, timeout));
    for (rdzv::JobStatus& j : jobs)
      if (j.job_id == options_.job_id) return std::move(j);
    return absl::NotFoundError(absl::StrCat("the rendezvous does not know job ", options_.job_id));
  }

  // The client is set by Open() before the agent starts its reporter and
  // reset by Close() after it stopped it; gRPC stubs are thread-safe.
  std::vector<std::string> StoreWaitedKeys(std::size_t max) override {
    std::lock_guard<std::mutex> lock(store_mu_);
    return store_server_ ? store_server_->engine().WaitedKeys(max) : std::vector<std::string>{};
  }

  absl::StatusOr<rdzv::MetricsReply> ReportMetrics(const rdzv::MetricsReport& report,
                                                   Duration timeout) override {
    if (!client_) return absl::FailedPreconditionError("not connected to the rendezvous");
    return client_->ReportMetrics(report, timeout);
  }

  void Close() override {
    EndJoin();
    client_.reset();
    if (server_) server_->Shutdown();
    server_.reset();
    std::lock_guard<std::mutex> lock(store_mu_);
    store_server_.reset();
  }

 private:
  absl::Status Interrupted() const { return absl::CancelledError("interrupted by a signal"); }
  bool CheckInterrupted() const { return interrupted_ != nullptr && (*interrupted_)(); }

  absl::Status OpenByMode(TimePoint deadline) {
    switch (options_.mode) {
      case RendezvousMode::kEmbedded: {
        const std::string bind = options_.rdzv_host.empty() ? "0.0.0.0" : options_.rdzv_host;
        if (absl::Status st = HostRendezvous(bind, options_.rdzv_port); !st.ok()) {
          if (rdzv::KindOf(st) == rdzv::ErrorKind::kBadInput) return st;  // TLS files
          return absl::UnavailableError(absl::StrCat(
              "cannot host the rendezvous on ", rdzv::FormatHostPort(bind, options_.rdzv_port),
              ": ", st.message(), "; pick a free port or another --rdzv_endpoint"));
        }
        const std::string host = IsAnyAddress(bind) ? "127.0.0.1" : bind;
        return ConnectClient(host, server_->port(), deadline);
      }
      case RendezvousMode::kRemote: {
        if (has_replicas()) return ConnectReplicas(deadline);
        const std::string& host = options_.rdzv_host;
        const int port = options_.rdzv_port;
        // Whether the endpoint is ours is known only once its name resolves.
        DDPRUN_RETURN_IF_ERROR(AwaitName(host, port, "--rdzv_endpoint", deadline));
        if (options_.is_host.value_or(false)) {
          // Told to host (torchrun's is_host=true): the endpoint's name may be
          // a virtual IP or a load balancer that leads here, so serve the port
          // on every interface.
          if (absl::Status st = HostRendezvous("0.0.0.0", port); !st.ok()) {
            if (rdzv::KindOf(st) == rdzv::ErrorKind::kBadInput) return st;  // TLS files
            return absl::UnavailableError(
                absl::StrCat("--rdzv_conf is_host=true, but this node cannot serve port ", port,
                             ": ", st.message(), "; free the port, or drop is_host on this node"));
          }
          Log(absl::StrCat("hosting the rendezvous at ", rdzv::FormatHostPort(host, port),
                           " (--rdzv_conf is_host=true)"));
        } else if (options_.is_host.value_or(true) && IsLocalHost(host)) {
          // Like torchrun's c10d is_host: the endpoint is ours, so serve it
          // unless somebody (ddprund, another local agent) already does.
          auto probe = rdzv::RendezvousClient::Create(host, port, tls_);
          const absl::Status probed = probe->WaitForConnected(kHostProbe);
          // A server that refuses our handshake is there: ConnectClient says why.
          if (!probed.ok() && !rdzv::IsTlsHandshakeError(probed)) {
            const std::string bind = IsLoopbackHost(host) && host != "localhost" ? host : "0.0.0.0";
            if (absl::Status hosted = HostRendezvous(bind, port); hosted.ok()) {
              Log(absl::StrCat("hosting the rendezvous at ", rdzv::FormatHostPort(host, port)));
            } else if (rdzv::KindOf(hosted) == rdzv::ErrorKind::kBadInput) {
              return hosted;  // TLS files unfit to serve (ServerTls)
            } else {
              DDPRUN_RETURN_IF_ERROR(JoinOrRefuseHolder(host, port));
            }
          } else if (probed.ok()) {
            NoteJoiningHolder(host, port);
          }
        }
        return ConnectClient(host, port, deadline);
      }
      case RendezvousMode::kStatic:
        return OpenStatic(deadline);
    }
    return absl::InternalError("unknown rendezvous mode");
  }

  // Returns once `host` resolves (pod DNS: name_wait.h), or its error at the
  // deadline. A wildcard or empty host names no one: nothing to look up.
  absl::Status AwaitName(const std::string& host, int port, const char* flag,
                         TimePoint deadline) {
    if (IsAnyAddress(host)) return absl::OkStatus();
    return WaitUntilResolves({host, port, flag, options_.policy.join_timeout_s}, clock_, deadline,
                             [this] { return CheckInterrupted(); },
                             [this](const std::string& line) { Log(line); });
  }

  // This node should host the rendezvous at host:port, but the port was
  // taken since the probe. Another local agent that won the race serves it
  // within kRaceProbe: join it. Anything else holds the port: one line naming
  // the port and, where /proc tells, the process (exit 3, as the static
  // master port).
  absl::Status JoinOrRefuseHolder(const std::string& host, int port) {
    auto probe = rdzv::RendezvousClient::Create(host, port, tls_);
    const absl::Status probed = probe->WaitForConnected(kRaceProbe);
    if (probed.ok() || rdzv::IsTlsHandshakeError(probed)) {
      NoteJoiningHolder(host, port);
      return absl::OkStatus();
    }
    const std::string holder = rdzv::DescribePortHolder(port);
    return absl::UnavailableError(absl::StrCat(
        "cannot host the rendezvous at ", rdzv::FormatHostPort(host, port), ": port ", port,
        " is in use by ", holder.empty() ? "another program" : holder,
        ", which is not a ddprun rendezvous; stop it, or pick a free port in --rdzv_endpoint"));
  }

  // The local endpoint is already served (a ddprund, or another job's or
  // node's agent hosting it): this node joins it, and says whose it is.
  void NoteJoiningHolder(const std::string& host, int port) const {
    const std::string holder = rdzv::DescribePortHolder(port);
    Log(absl::StrCat("the rendezvous at ", rdzv::FormatHostPort(host, port), " is already served",
                     holder.empty() ? std::string() : absl::StrCat(" by ", holder),
                     " (a ddprund, or another node's ddprun hosting it); this node joins it"));
  }

  void Log(const std::string& msg) const {
    std::string line = absl::StrCat("ddprun: ", rdzv::Fence(options_.job_id, 0), msg, "\n");
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }

  // The hosted rendezvous speaks TLS when this node does (docs/tls.md):
  // its --tls_cert/--tls_key serve, and its --tls_ca verifies every client
  // (mutual TLS), so every node needs a certificate from that CA.
  absl::StatusOr<rdzv::TlsConfig> ServerTls() const {
    if (!tls_.enabled) return rdzv::TlsConfig{};
    const rdzv::TlsOptions& t = options_.tls;
    if (t.cert_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("this node hosts the rendezvous and ", t.names.ca,
                       " asks for TLS, but it has no ", t.names.cert,
                       "; give it --tls_cert and --tls_key (a certificate for the address "
                       "the nodes connect to)"));
    }
    rdzv::TlsOptions server = t;
    server.client_ca_file = t.ca_file;
    server.names.client_ca = t.names.ca;
    return rdzv::LoadServerTls(server);
  }

  absl::Status HostRendezvous(const std::string& bind_host, int port) {
    rdzv::ServerOptions so;
    so.host = bind_host;
    so.port = port;
    absl::StatusOr<rdzv::TlsConfig> tls = ServerTls();
    if (!tls.ok()) return rdzv::UsageMistake(tls.status().message());  // the user's TLS flags
    so.tls = *std::move(tls);
    so.log_prefix = "ddprun: ";
    so.client_ca_flag = options_.tls.names.ca;
    so.dashboard_port = options_.dashboard_port;
    so.dashboard_listen_fix = "pick another --dashboard_port, or --dashboard_port=off";
    if (!options_.web_config.empty()) {  // checked by the launcher already
      auto config = rdzv::ReadWebConfig(options_.web_config, options_.web_config_source);
      auto security = config.ok() ? rdzv::LoadWebSecurity(*config, options_.web_config,
                                                          options_.web_config_source)
                                  : absl::StatusOr<rdzv::WebSecurity>(config.status());
      if (!security.ok()) return rdzv::UsageMistake(security.status().message());
      so.dashboard_security = *std::move(security);
    }
    DDPRUN_ASSIGN_OR_RETURN(server_, rdzv::RendezvousServer::Start(so));
    if (server_->dashboard_port() >= 0) {
      const std::string shown =
          IsAnyAddress(bind_host) ? (options_.local_addr.empty() ? Hostname() : options_.local_addr)
                                  : bind_host;
      if (!options_.web_config.empty()) {
        Log("the monitoring port serves " + rdzv::DescribeWebSecurity(so.dashboard_security));
      } else if (so.tls.enabled) {
        Log("warning: the monitoring port serves plain HTTP to anyone who can reach it, next to "
            "a TLS rendezvous; give --web_config FILE (docs/security.md) or "
            "--dashboard_port=off");
      }
      Log(absl::StrCat("dashboard at ", so.dashboard_security.tls.enabled ? "https://" : "http://",
                       rdzv::FormatHostPort(shown, server_->dashboard_port()),
                       "/ (Prometheus: /metrics; in a terminal: ddprun top --rdzv_endpoint ",
                       rdzv::FormatHostPort(shown, server_->port()), " --job ", options_.job_id,
                       ")"));
    }
    DDPRUN_DEBUG_LOG(kAgent) << "hosting the rendezvous on "
                             << rdzv::FormatHostPort(bind_host, server_->port());
    return absl::OkStatus();
  }

  // Waits, in slices, until the client connects.
  absl::Status ConnectClient(const std::string& host, int port, TimePoint deadline) {
    connect_host_ = host;
    connect_port_ = port;
    client_ = rdzv::RendezvousClient::Create(host, port, tls_);
    const TimePoint notice_at = clock_.Now() + kConnectNotice;
    absl::Status st;
    do {
      if (CheckInterrupted()) return Interrupted();
      auto slice = std::min<Duration>(seconds(1), deadline - clock_.Now());
      st = client_->WaitForConnected(std::max<Duration>(slice, milliseconds(1)));
      if (rdzv::IsTlsHandshakeError(st)) return st;  // waiting cannot fix it
      if (!st.ok()) NoteStillConnecting(rdzv::FormatHostPort(host, port), notice_at, deadline);
    } while (!st.ok() && clock_.Now() < deadline);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach the rendezvous at ", rdzv::FormatHostPort(host, port),
                       " within ", options_.policy.join_timeout_s,
                       " s; start ddprund (or the host node) there, or fix "
                       "--rdzv_endpoint"));
    }
    return absl::OkStatus();
  }

  // Once, kConnectNotice into a connect that has not succeeded yet: what it
  // waits for and until when.
  void NoteStillConnecting(const std::string& where, TimePoint notice_at, TimePoint deadline) {
    const TimePoint now = clock_.Now();
    if (connect_noticed_ || now < notice_at || now >= deadline) return;
    connect_noticed_ = true;
    Log(absl::StrCat("nothing answers as the rendezvous at ", where, " yet; waiting until ",
                     rdzv::WallClockAfter(deadline - now),
                     " (--rdzv_conf join_timeout=", options_.policy.join_timeout_s,
                     "); start ddprund (or the host node) there, or fix --rdzv_endpoint"));
  }

  // Several ddprund replicas: the first that accepts a connection, in turn,
  // until the deadline. Never hosts: the replicas serve.
  absl::Status ConnectReplicas(TimePoint deadline) {
    replica_ = options_.rdzv_replicas.size() - 1;  // WaitForConnected starts at the next: 0
    std::vector<std::string> names;
    for (const auto& hp : options_.rdzv_replicas) names.push_back(rdzv::FormatHostPort(hp));
    const TimePoint notice_at = clock_.Now() + kConnectNotice;
    absl::Status st;
    do {
      if (CheckInterrupted()) return Interrupted();
      st = WaitForConnected(std::max<Duration>(
          std::min<Duration>(seconds(1), deadline - clock_.Now()), milliseconds(1)));
      if (rdzv::IsTlsHandshakeError(st)) return st;  // waiting cannot fix it
      if (!st.ok()) NoteStillConnecting(absl::StrJoin(names, ", "), notice_at, deadline);
    } while (!st.ok() && clock_.Now() < deadline);
    if (!st.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach any ddprund replica (", absl::StrJoin(names, ", "), ") within ",
          options_.policy.join_timeout_s, " s; start ddprund there, or fix --rdzv_endpoint"));
    }
    return absl::OkStatus();
  }

  absl::Status OpenStatic(TimePoint deadline) {
    const std::string& maddr = options_.master_addr;
    const int mport = options_.master_port;
    master_port_ = mport;
    if (options_.node_rank < 0) {
      return absl::InvalidArgumentError(
          "static rendezvous needs this node's rank; pass --node_rank (0 on the master node)");
    }
    // Node rank 0 too: its own client and the endpoint it publishes use the name.
    DDPRUN_RETURN_IF_ERROR(AwaitName(maddr, mport, "--master_addr", deadline));
    if (options_.node_rank == 0) {
      // As c10d's single-node TCPStore: a loopback master address is served
      // on loopback alone (and advertised as such); any other on every
      // interface, for the other nodes.
      const std::string bind =
          IsLoopbackHost(maddr) ? (maddr == "localhost" ? "127.0.0.1" : maddr) : "0.0.0.0";
      rdzv::C10dStoreServerOptions so;
      so.host = bind;
      so.port = mport;
      auto store = rdzv::C10dStoreServer::Start(so);
      if (!store.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot serve the store on master port ", mport,
                                                   ": ", store.status().message()));
      }
      {
        std::lock_guard<std::mutex> lock(store_mu_);
        store_server_ = std::move(*store);
      }
      if (absl::Status st = HostRendezvous(bind, 0); !st.ok()) {
        if (rdzv::KindOf(st) == rdzv::ErrorKind::kBadInput) return st;  // TLS files
        return absl::UnavailableError(absl::StrCat("cannot host the rendezvous: ", st.message()));
      }
      const std::string host = IsAnyAddress(maddr) ? "127.0.0.1" : maddr;
      DDPRUN_RETURN_IF_ERROR(store_server_->engine().Set(
          kRdzvEndpointKey, rdzv::FormatHostPort(host, server_->port())));
      return ConnectClient(host, server_->port(), deadline);
    }
    // Other nodes read node 0's rendezvous endpoint from its store.
    std::string endpoint;
    absl::Status last = absl::DeadlineExceededError("no attempt");
    // Each attempt takes at most ~3 s, so the line comes 5-8 s into the wait.
    rdzv::WaitNotice notice(
        clock_,
        [&] {
          return rdzv::WaitState{
              absl::StrCat("waiting for node rank 0 (--master_addr/--master_port ",
                           rdzv::FormatHostPort(maddr, mport), ")"),
              absl::StrCat("its store has not answered yet (", last.message(), ")"), deadline,
              absl::StrCat("exit ", kExitRendezvousError, " (--rdzv_conf join_timeout)")};
        },
        [this](const std::string& line) { Log(line); });
    while (clock_.Now() < deadline) {
      if (CheckInterrupted()) return Interrupted();
      notice.Poll();
      const double left = SecondsOf(deadline - clock_.Now());
      auto client = rdzv::C10dStoreClient::Connect(maddr, mport, std::min(1.0, left));
      if (!client.ok()) {
        last = client.status();
        continue;
      }
      auto value = (*client)->Get(kRdzvEndpointKey, std::min(2.0, std::max(0.01, left)));
      if (value.ok()) {
        endpoint = *value;
        break;
      }
      last = value.status();
    }
    if (endpoint.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the master node's store at ", rdzv::FormatHostPort(maddr, mport),
          " within ", options_.policy.join_timeout_s, " s (", last.message(),
          "); start node rank 0, or fix --master_addr/--master_port"));
    }
    DDPRUN_ASSIGN_OR_RETURN(rdzv::HostPort hp, rdzv::ParseHostPort(endpoint));
    return ConnectClient(hp.host, hp.port, deadline);
  }

  const AgentOptions options_;
  const rdzv::Clock& clock_;
  const std::function<bool()>* interrupted_ = nullptr;  // during Open()

  std::unique_ptr<rdzv::RendezvousServer> server_;  // when this agent hosts it
  std::mutex store_mu_;  // guards store_server_ for StoreWaitedKeys (reporter thread)
  std::unique_ptr<rdzv::C10dStoreServer> store_server_;  // the workers' TCPStore
  std::unique_ptr<rdzv::RendezvousClient> client_;
  rdzv::TlsConfig tls_;  // this node's, checked in Open()
  std::string connect_host_;
  int connect_port_ = 0;
  bool connect_noticed_ = false;       // NoteStillConnecting said it once
  std::size_t replica_ = 0;            // with replicas: the index of connect_host_:connect_port_
  std::vector<TimePoint> down_until_;  // with replicas: tried after the others until then
  int master_port_ = 0;

  std::unique_ptr<rdzv::JoinStream> stream_;
  std::thread reader_;
  std::uint64_t stream_id_ = 0;
};

}  // namespace

std::unique_ptr<RendezvousSession> MakeGrpcRendezvousSession(const AgentOptions& options,
                                                             const rendezvous::Clock& clock) {
  return std::make_unique<GrpcRendezvousSession>(options, clock);
}

}  // namespace ddprun::agent
