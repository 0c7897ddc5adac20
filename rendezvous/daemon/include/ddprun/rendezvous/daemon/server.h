// The rendezvous server: the Rendezvous and Store gRPC services
// (rendezvous_services.h) over the round state machine of every job, which
// the daemon's composition root (src/daemon.h) builds from these options.
// ddprund runs one; ddprun embeds one when it hosts the rendezvous itself.
// The gRPC types stay behind the pimpl.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/ha/etcd_client.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/web_server.h"

namespace ddprun::rendezvous {

class MetricsHub;  // metrics_hub.h

// ddprund's defaults (its --help and docs/cli.md are written from these).
inline constexpr char kDefaultServerHost[] = "0.0.0.0";  // every IPv4 interface
inline constexpr Duration kDefaultLeaseTimeout = std::chrono::seconds(4);
inline constexpr char kDefaultEtcdPrefix[] = "/ddprun";
inline constexpr std::int64_t kDefaultEtcdLeaseTtlS = 2;

struct ServerOptions {
  std::string host{kDefaultServerHost};
  int port = kDefaultRdzvPort;  // 0: the OS picks one; see RendezvousServer::port().
  // What a failure to listen tells the user to do (the caller knows its flags).
  std::string listen_fix = "pick another port or stop the process that holds it";
  // Deadlines (last call, join, reattach and store-wait timeouts) are applied
  // when they pass: the server waits for the next one, it does not poll.
  const Clock* clock = &SystemClock::Get();
  // Where jobs and their stores are persisted (fsync) so that a restarted
  // server resumes them; "" keeps everything in memory.
  std::string state_dir;
  // How long a restored member has to re-attach before it counts as lost.
  Duration reattach_timeout = kDefaultReattachTimeout;
  // An agent whose connection is silent this long (cut network) is lost.
  Duration lease_timeout = kDefaultLeaseTimeout;
  // Hosts that keep failing are refused for a while (see job_rendezvous.h).
  QuarantinePolicy quarantine;
  // TLS (LoadServerTls); disabled: plaintext. With client_ca_pem, clients
  // without a certificate it signed are refused (docs/tls.md).
  TlsConfig tls;
  // For the one line a TLS server prints per refused handshake (rate-limited):
  // who prints it and which flag names the CA that clients must be signed by.
  std::string log_prefix = "ddprund: ";
  std::string client_ca_flag = "--tls_client_ca";
  // Monitoring (docs/monitoring.md): the HTTP port of the dashboard, the
  // JSON API and /metrics. -1: off; 0: the OS picks one (see
  // dashboard_port()). A port in use fails Start with InvalidArgument
  // "dashboard: cannot listen on HOST:PORT: <why>; <dashboard_listen_fix>".
  int dashboard_port = -1;
  std::string dashboard_host;  // "": the same as host
  std::string dashboard_listen_fix = "pick another --dashboard_port, or `off`";
  // What the monitoring port enforces (web_server.h, docs/security.md):
  // HTTPS and basic auth from --web_config, or the gRPC port's certificate
  // (WebSecurityFromGrpcTls). Default: plain HTTP, no authentication.
  WebSecurity dashboard_security;
  // Print every hang report on stderr (ddprund's log).
  bool log_hangs = false;

  // The replicated control plane (docs/ha.md): etcd's members; empty = one
  // daemon. With them, replicas elect one leader through etcd; it alone serves
  // and persists jobs and store keys there; the others answer Unavailable
  // naming the leader, and `Status` from etcd.
  std::vector<HostPort> etcd_endpoints;
  std::string etcd_prefix{kDefaultEtcdPrefix};            // keys of this ddprund cluster
  std::int64_t etcd_lease_ttl_s = kDefaultEtcdLeaseTtlS;  // a killed leader is replaced within it
  // etcd's --max-request-bytes: no request to etcd is larger (a job snapshot
  // is cut into chunks under it; a store value that cannot fit is refused).
  std::int64_t etcd_max_request_bytes = kEtcdDefaultMaxRequestBytes;
  TlsOptions etcd_tls;  // client TLS to etcd
  // How agents reach this replica, "H:P" (followers name the leader by it);
  // "" = host:port, with this machine's hostname for 0.0.0.0.
  std::string advertise;
  // The leadership was lost (lease expired, another replica leads): this
  // replica must stop serving. ddprund prints it and exits; null = the same.
  std::function<void(const absl::Status&)> on_deposed;

  // Serve this table instead of a table of the server's own (borrowed; it
  // must outlive the server). Its owner has recovered it and applies its
  // deadlines; state_dir, reattach_timeout, quarantine and etcd_* are then
  // unused (etcd_endpoints must be empty). ddprun's single-node agent owns
  // its table and starts a server over it only when a client first connects
  // (agent/src/local_rendezvous_session.cc).
  JobTable* table = nullptr;
  // With `table`: the hub that table reports to (borrowed, required). Its
  // owner ticks it and serves its HTTP port; dashboard_port and log_hangs are
  // then unused, and this server only answers ReportMetrics/GetMetrics.
  MetricsHub* hub = nullptr;
  // Listen on no port: connections accepted elsewhere are handed in with
  // RendezvousServer::HandOver(); port() is then `port` as given. `tls`
  // applies to them as to a listening port.
  bool external_connections = false;
};

class RendezvousServer {
 public:
  // Binds and starts serving. Fails with a one-line message: Unavailable
  // "cannot listen on HOST:PORT: <why>; <listen_fix>" if the port is in use,
  // or the state directory's error.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const ServerOptions& opts);
  ~RendezvousServer();  // Shutdown() then join.

  int port() const;
  // The monitoring HTTP port, -1 when it is off.
  int dashboard_port() const;
  // Serves an accepted connection (takes the fd; external_connections only).
  // `first_bytes` were read from it already and are served first.
  void HandOver(int fd, const std::string& first_bytes = "");
  // Stops accepting calls and ends every open stream (with a deadline).
  void Shutdown();
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // A snapshot of every job (for `ddprun status` and tests).
  std::vector<JobStatus> Status() const;

  class Impl;  // opaque; defined in server.cc

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
