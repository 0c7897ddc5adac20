// RendezvousServer (server.h): the composition root (daemon.h) behind the
// gRPC services (rendezvous_services.h), started and stopped in order.
#include "ddprun/rendezvous/daemon/server.h"

#include <condition_variable>
#include <mutex>

#include "daemon.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/rendezvous/rendezvous_services.h"

namespace ddprun::rendezvous {

class RendezvousServer::Impl {
 public:
  explicit Impl(const ServerOptions& opts) : opts_(opts), daemon_(opts) {}
  ~Impl() { Shutdown(); }

  // The daemon's state first, then the services over it, then what needs
  // their port (the dashboard, the election).
  absl::Status Start() {
    SilenceGrpcLogging();
    DDPRUN_RETURN_IF_ERROR(daemon_.Build());
    GrpcServicesOptions so;
    so.host = opts_.host;
    so.port = opts_.port;
    so.listen_fix = opts_.listen_fix;
    so.lease_timeout = opts_.lease_timeout;
    so.tls = opts_.tls;
    so.log_prefix = opts_.log_prefix;
    so.client_ca_flag = opts_.client_ca_flag;
    so.external_connections = opts_.external_connections;
    DDPRUN_ASSIGN_OR_RETURN(services_, GrpcServices::Start(so, daemon_));
    if (absl::Status st = daemon_.Serve(services_->port()); !st.ok()) {
      Shutdown();
      return st;
    }
    return absl::OkStatus();
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(shutdown_mu_);
      if (shutting_down_) return;
      shutting_down_ = true;
    }
    shutdown_cv_.notify_all();
    daemon_.Stop();
    if (services_) services_->Shutdown();
    daemon_.StepDown();
  }

  void Wait() {
    std::unique_lock<std::mutex> lock(shutdown_mu_);
    shutdown_cv_.wait(lock, [&] { return shutting_down_; });
  }

  int port() const { return services_->port(); }
  int dashboard_port() const { return daemon_.dashboard_port(); }
  void HandOver(int fd, const std::string& first_bytes) { services_->HandOver(fd, first_bytes); }
  std::vector<JobStatus> Status() { return daemon_.table().Status(); }

 private:
  const ServerOptions opts_;
  // The services call the daemon: they are destroyed first.
  Daemon daemon_;
  std::unique_ptr<GrpcServices> services_;
  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutting_down_ = false;
};

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousServer::~RendezvousServer() = default;

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const ServerOptions& opts) {
  auto impl = std::make_unique<Impl>(opts);
  DDPRUN_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

int RendezvousServer::port() const { return impl_->port(); }
int RendezvousServer::dashboard_port() const { return impl_->dashboard_port(); }
void RendezvousServer::HandOver(int fd, const std::string& first_bytes) {
  impl_->HandOver(fd, first_bytes);
}
void RendezvousServer::Shutdown() { impl_->Shutdown(); }
void RendezvousServer::Wait() { impl_->Wait(); }
std::vector<JobStatus> RendezvousServer::Status() const { return impl_->Status(); }

}  // namespace ddprun::rendezvous
