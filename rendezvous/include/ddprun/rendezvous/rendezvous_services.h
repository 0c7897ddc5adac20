// The Rendezvous and Store gRPC services and the gRPC server that carries
// them. Protos are converted at the edge; every call goes to a
// ServiceBackend, which owns (or borrows) the job table and the metrics hub
// and says whether this process serves jobs at all. Join streams run on the
// async API over completion_queues.h (which says why); every other method on
// the callback API. Stream writes go through sinks that outlive their calls.
//
// ddprund's composition root (rendezvous/daemon/src/daemon.h) is the backend
// of ddprund and of the server ddprun embeds; the gRPC types stay in the .cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/job_table.h"

namespace ddprun::rendezvous {

class MetricsHub;  // monitoring/metrics_hub.h

// What the services call. Every method may run on any gRPC thread, at once.
class ServiceBackend {
 public:
  virtual JobTable& table() = 0;
  virtual MetricsHub& hub() = 0;
  virtual TimePoint Now() const = 0;
  // OK where this process serves jobs; otherwise Unavailable saying who does
  // (a standby replica names the leader). Every Join, Report and store call
  // is refused with it.
  virtual absl::Status Gate() const = 0;
  // Every job (or the one named) as a process that does not serve sees it
  // (a standby reads etcd); `Status` answers with it when Gate() refuses.
  virtual std::vector<JobStatus> StandbyStatus(const std::string& job_id) const = 0;
  // How long the seat of a node whose Join stream just broke is held for its
  // agent to re-attach (JobTable::StreamLost): zero (lost at once) unless
  // this process was just stalled, when the agent may have dropped the
  // stream because nothing answered its keepalive.
  virtual Duration LostStreamHold() const = 0;

 protected:
  ~ServiceBackend() = default;
};

struct GrpcServicesOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the OS picks one; see GrpcServices::port()
  // What a failure to listen tells the user to do.
  std::string listen_fix;
  // Keepalive pings detect a silent peer within it.
  Duration lease_timeout = std::chrono::seconds(4);
  TlsConfig tls;
  // For the rate-limited line printed per refused TLS handshake.
  std::string log_prefix;
  std::string client_ca_flag;
  // Listen on no port: connections come through GrpcServices::HandOver.
  bool external_connections = false;
};

class GrpcServices {
 public:
  // Registers the services and starts serving on a port (or on handed-over
  // connections). Fails with Unavailable "cannot listen on HOST:PORT: <why>;
  // <listen_fix>". `backend` must outlive the services.
  static absl::StatusOr<std::unique_ptr<GrpcServices>> Start(const GrpcServicesOptions& opts,
                                                             ServiceBackend& backend);
  ~GrpcServices();  // Shutdown()

  int port() const;
  // Serves an accepted connection (takes the fd; external_connections only,
  // otherwise it is closed). `first_bytes` were read from it already.
  void HandOver(int fd, const std::string& first_bytes);
  // Accepts no new Join, ends open calls (a 2 s deadline), then joins the
  // queues' threads. Idempotent. The backend should have ended its streams
  // first (JobTable::Shutdown), so that this cannot wait for them.
  void Shutdown();

  class Impl;  // opaque; defined in rendezvous_services.cc

 private:
  explicit GrpcServices(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
