// The daemon's composition root: builds what a rendezvous server serves (the
// --state_dir log or the etcd journal, the metrics hub, the job table and its
// deadline timer; or the table and hub it borrows), then, once the gRPC
// services listen, the dashboard, the hub's ticker and the etcd election, and
// owns the leader/standby life cycle. The gRPC services
// (rendezvous_services.h) call it as their ServiceBackend; server.cc wires
// the two behind RendezvousServer.
//
// Life cycle: Build(), then Serve(port) once the port is known; at the end
// Stop() before the services shut down (it ends every open stream and store
// wait, so theirs cannot hang), then StepDown() after them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/deadline_timer.h"
#include "ddprun/rendezvous/common/stall_watch.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/ha/etcd_client.h"
#include "ddprun/rendezvous/ha/etcd_election.h"
#include "ddprun/rendezvous/ha/etcd_journal.h"
#include "ddprun/rendezvous/ha/state_log.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/hub_ticker.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"
#include "ddprun/rendezvous/rendezvous_services.h"

namespace ddprun::rendezvous {

// A stall this long gets ddprund's line (stall_watch.h), at most one a period.
inline constexpr Duration kStallLineMin = std::chrono::seconds(1);
inline constexpr Duration kStallLinePeriod = std::chrono::seconds(10);

class Daemon final : public ServiceBackend {
 public:
  explicit Daemon(const ServerOptions& opts);
  ~Daemon();  // Stop(), StepDown()

  // Opens the journal (a bad --state_dir, an unreachable etcd or a prefix
  // holding another program's data is one line), builds the hub and the
  // table and recovers it (a replica recovers when it is elected), and starts
  // the deadline timer; with opts.table, borrows that table and opts.hub.
  absl::Status Build();
  // After the services listen on `port`: the dashboard (a port in use is
  // InvalidArgument "dashboard: ..."), the hub's ticker, and the election of
  // a replica (it advertises `port` unless opts.advertise says otherwise).
  absl::Status Serve(int port);
  // Stops the ticker, the dashboard and the timer, and shuts an own table
  // down (every stream ended, every store wait cancelled). Idempotent; not
  // thread-safe (the server calls it under its shutdown guard).
  void Stop();
  // Last, after the services: a leader revokes its lease, so a standby takes
  // over at once.
  void StepDown();

  // The monitoring HTTP port, -1 when it is off.
  int dashboard_port() const { return http_ ? http_->port() : -1; }

  // ServiceBackend. Gate(): OK always, but a replica of the etcd control
  // plane only while it leads; otherwise Unavailable naming the leader.
  // StandbyStatus(): every job (or one) as etcd holds it.
  JobTable& table() override { return *table_; }
  MetricsHub& hub() override { return *hub_; }
  TimePoint Now() const override { return clock_.Now(); }
  absl::Status Gate() const override;
  std::vector<JobStatus> StandbyStatus(const std::string& job_id) const override;
  // --reattach_timeout while the stall watch says this process was just
  // stalled (docs/ha.md, "A stalled ddprund"), zero otherwise.
  Duration LostStreamHold() const override;

 private:
  absl::Status StartEtcd();
  void OnElected(std::int64_t revision);
  void OnDeposed(const absl::Status& why);
  // /readyz (monitoring_routes.h): without etcd always ready; with etcd ready
  // while this replica leads, or stands by with its lease alive and a leader
  // known; 503 otherwise.
  Readiness Ready() const;

  ServerOptions opts_;
  const Clock& clock_;
  std::unique_ptr<StateLog> state_;
  std::unique_ptr<MetricsHub> own_hub_;  // before the table, which tells it about jobs
  MetricsHub* hub_ = nullptr;            // own_hub_ or opts_.hub
  // The replicated control plane (--etcd_endpoints): the client, the journal
  // and the election; serving_ is true once this replica leads.
  std::string etcd_prefix_;
  std::string advertise_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<EtcdJournal> etcd_journal_;
  std::unique_ptr<EtcdElection> election_;
  // election_ for the HTTP thread's /readyz (set after the port serves,
  // cleared before election_ goes).
  std::atomic<const EtcdElection*> election_view_{nullptr};
  std::atomic<bool> serving_{true};
  std::unique_ptr<JobTable> own_table_;      // unless opts_.table is given
  JobTable* table_ = nullptr;                // own_table_ or opts_.table
  std::unique_ptr<DeadlineTimer> timer_;     // before the services: calls notify it
  std::unique_ptr<StallWatch> stall_watch_;  // LostStreamHold()
  // Monitoring: the hub's one-second ticker (series points, hang deadlines)
  // and the HTTP port.
  std::unique_ptr<HubTicker> ticker_;
  std::unique_ptr<HttpServer> http_;
  bool stopped_ = false;  // Stop() ran
};

}  // namespace ddprun::rendezvous
