// The daemon's composition root (daemon.h).
#include "daemon.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/monitoring/hang_action.h"
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"

namespace ddprun::rendezvous {

Daemon::Daemon(const ServerOptions& opts) : opts_(opts), clock_(*opts.clock) {}

Daemon::~Daemon() {
  Stop();
  StepDown();
}

absl::Status Daemon::Build() {
  if (opts_.table != nullptr) {
    // Its owner recovered it, runs its deadlines, ticks its hub and serves
    // the hub's HTTP port (agent/src/local_rendezvous_session.cc).
    if (opts_.hub == nullptr || !opts_.etcd_endpoints.empty()) {
      return absl::InvalidArgumentError(
          "a server over a borrowed job table needs that table's metrics hub and no etcd");
    }
    table_ = opts_.table;
    hub_ = opts_.hub;
  } else {
    if (!opts_.state_dir.empty()) {
      DDPRUN_ASSIGN_OR_RETURN(state_, StateLog::Open(opts_.state_dir));
    }
    MetricsHubOptions hub_opts;
    hub_opts.clock = &clock_;
    if (opts_.log_hangs) {
      hub_opts.log = [](const std::string& report) {
        std::fprintf(stderr, "ddprund: %s", report.c_str());
        std::fflush(stderr);
      };
    }
    hub_opts.act = [this](const std::string& job, std::int64_t round, const std::string& node,
                          OnHang action, const WorkerFailure& failure) {
      absl::Status st = ApplyOnHang(*table_, job, round, node, action, failure);
      if (!st.ok() && KindOf(st) != ErrorKind::kState) {
        std::fprintf(stderr, "ddprund: %s\n", std::string(st.message()).c_str());
      }
    };
    own_hub_ = std::make_unique<MetricsHub>(std::move(hub_opts));
    hub_ = own_hub_.get();
    JobTableOptions table_opts;
    table_opts.clock = &clock_;
    table_opts.observer = hub_;
    table_opts.quarantine = opts_.quarantine;
    table_opts.reattach_timeout = opts_.reattach_timeout;
    table_opts.journal = state_.get();
    if (!opts_.etcd_endpoints.empty()) {
      if (state_) {
        return absl::InvalidArgumentError(
            "--state_dir and --etcd_endpoints exclude each other: replicas keep their state in "
            "etcd; drop --state_dir");
      }
      DDPRUN_RETURN_IF_ERROR(StartEtcd());
      table_opts.journal = etcd_journal_.get();
      serving_ = false;  // until elected
    }
    table_opts.on_deadline = [this](TimePoint t) { timer_->Notify(t); };
    own_table_ = std::make_unique<JobTable>(std::move(table_opts));
    table_ = own_table_.get();
    if (!etcd_) DDPRUN_RETURN_IF_ERROR(table_->Recover());  // a replica recovers when elected
    // Before any call can reach the table (on_deadline uses it).
    timer_ = std::make_unique<DeadlineTimer>(
        clock_, [this] { return table_->NextDeadline(); }, [this] { table_->Tick(); });
  }

  // One line for a stall a person would notice (a loaded host's shorter ones
  // still hold seats, silently but for the dashboard's events), at most one
  // every kStallLinePeriod; ddprund's own (an agent hosting the rendezvous
  // holds seats too, but its flags are not ddprund's).
  stall_watch_ =
      std::make_unique<StallWatch>([this, last = std::chrono::steady_clock::time_point()](
                                       std::chrono::steady_clock::duration length) mutable {
        const auto now = std::chrono::steady_clock::now();
        if (!own_table_ || length < kStallLineMin || now - last < kStallLinePeriod) return;
        last = now;
        std::fprintf(stderr,
                     "ddprund: this process was stalled for %.1f s (stopped, swapped out or "
                     "starved of CPU); agents whose streams broke meanwhile keep their seats "
                     "for --reattach_timeout (%g s) to re-attach\n",
                     std::chrono::duration<double>(length).count(),
                     std::chrono::duration<double>(opts_.reattach_timeout).count());
        std::fflush(stderr);
      });
  return absl::OkStatus();
}

Duration Daemon::LostStreamHold() const {
  return stall_watch_ && stall_watch_->StalledRecently() ? opts_.reattach_timeout
                                                         : Duration::zero();
}

absl::Status Daemon::Serve(int port) {
  if (own_hub_ && opts_.dashboard_port >= 0) {
    HttpServerOptions ho;
    ho.host = opts_.dashboard_host.empty() ? opts_.host : opts_.dashboard_host;
    ho.port = opts_.dashboard_port;
    ho.listen_fix = opts_.dashboard_listen_fix;
    ho.on_refusal = MakeRefusalLog(opts_.log_prefix);
    MetricsHub* hub = hub_;
    // The health probes answer without basic auth: a kubelet has none
    // (docs/monitoring.md, Health probes).
    ho.open_paths = {"/healthz", "/readyz"};
    ReadinessProbe ready = [this] { return Ready(); };
    auto http = StartMonitoringServer(
        ho, opts_.dashboard_security,
        [hub, ready](const std::string& target) { return ServeMonitoring(*hub, target, ready); });
    if (!http.ok()) {
      // Bad input (the flag names a port in use), not a rendezvous port
      // another agent holds: callers tell the two apart by kind.
      return absl::InvalidArgumentError("dashboard: " + std::string(http.status().message()));
    }
    http_ = std::move(*http);
  }
  if (own_hub_) ticker_ = std::make_unique<HubTicker>(hub_);
  if (etcd_) {
    advertise_ = opts_.advertise;
    if (advertise_.empty()) {
      char name[256] = {};
      const bool any = opts_.host == "0.0.0.0" || opts_.host == "::" || opts_.host.empty();
      if (any && ::gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "localhost");
      advertise_ = FormatHostPort(any ? std::string(name) : opts_.host, port);
    }
    EtcdElectionOptions eo;
    eo.client = etcd_.get();
    eo.prefix = etcd_prefix_;
    eo.address = advertise_;
    eo.lease_ttl_s = opts_.etcd_lease_ttl_s;
    eo.on_elected = [this](std::int64_t revision) { OnElected(revision); };
    eo.on_deposed = [this](absl::Status why) { OnDeposed(why); };
    eo.on_standby = [this](const std::string& leader) {
      std::cerr << "ddprund: " << advertise_ << " is a standby replica; the leader is " << leader
                << " (etcd prefix " << etcd_prefix_
                << "); this replica takes over if the leader goes" << std::endl;
    };
    election_ = std::make_unique<EtcdElection>(std::move(eo));
    election_view_.store(election_.get());
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartEtcd() {
  DDPRUN_ASSIGN_OR_RETURN(etcd_prefix_, NormalizeEtcdPrefix(opts_.etcd_prefix));
  // A name that resolves nowhere is said at once, not as an etcd that gives
  // "no answer in time" after the client's retries.
  std::vector<std::string> unresolved;
  for (const HostPort& e : opts_.etcd_endpoints) {
    auto addrs = net::ResolveTcp(e.host, e.port);
    if (!addrs.ok()) {
      unresolved.push_back(absl::StrCat("'", e.host, "' (", addrs.status().message(), ")"));
    }
  }
  if (unresolved.size() == opts_.etcd_endpoints.size()) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the etcd endpoint name", unresolved.size() == 1 ? " " : "s ",
                     absl::StrJoin(unresolved, ", "), "; check --etcd_endpoints"));
  }
  EtcdOptions eo;
  eo.endpoints = opts_.etcd_endpoints;
  eo.tls = opts_.etcd_tls;
  DDPRUN_ASSIGN_OR_RETURN(etcd_, EtcdClient::Create(std::move(eo)));
  // Fails at start, in one line, when etcd is unreachable or the prefix holds
  // another program's data.
  if (absl::Status claimed = ClaimEtcdPrefix(*etcd_, etcd_prefix_); !claimed.ok()) {
    // An etcd that is there but refuses our handshake is named as such (one
    // probe per member), not as "unreachable".
    if (KindOf(claimed) == ErrorKind::kConnection) {
      DDPRUN_RETURN_IF_ERROR(etcd_->DiagnoseTls(std::chrono::seconds(1)));
    }
    return claimed;
  }
  EtcdJournalOptions jo;
  jo.client = etcd_.get();
  jo.prefix = etcd_prefix_;
  jo.may_lead = [this] { return election_ && election_->MayLead(); };
  jo.on_deposed = [this](absl::Status why) { OnDeposed(why); };
  jo.max_request_bytes = static_cast<std::size_t>(opts_.etcd_max_request_bytes);
  etcd_journal_ = std::make_unique<EtcdJournal>(std::move(jo));
  return absl::OkStatus();
}

void Daemon::OnElected(std::int64_t revision) {
  etcd_journal_->SetLeaderRevision(revision);
  if (absl::Status st = table_->Recover(); !st.ok()) {
    OnDeposed(st);
    return;
  }
  if (auto next = table_->NextDeadline()) timer_->Notify(*next);
  serving_ = true;
  std::cerr << "ddprund: " << advertise_ << " leads the control plane (etcd prefix " << etcd_prefix_
            << ", leader revision " << revision << ")" << std::endl;
}

void Daemon::OnDeposed(const absl::Status& why) {
  serving_ = false;
  if (opts_.on_deposed) {
    opts_.on_deposed(why);
    return;
  }
  std::cerr << "ddprund: " << why.message()
            << "; exiting so that the agents move to the replica that leads (restart this one: "
               "it rejoins as a standby)"
            << std::endl;
  std::_Exit(1);
}

absl::Status Daemon::Gate() const {
  if (serving_.load()) return absl::OkStatus();
  const std::string leader = election_ ? election_->leader() : "";
  return absl::UnavailableError(absl::StrCat(
      "ddprund at ", advertise_, " is a standby replica; ",
      leader.empty() ? std::string("no replica leads yet (is etcd reachable?)")
                     : "the leader is " + leader,
      " (etcd prefix ", etcd_prefix_,
      "); give agents every replica in --rdzv_endpoint and they move on by themselves"));
}

std::vector<JobStatus> Daemon::StandbyStatus(const std::string& job_id) const {
  std::vector<JobStatus> out;
  if (!etcd_journal_) return out;
  absl::StatusOr<std::vector<RecoveredJob>> jobs = etcd_journal_->Recover();
  if (!jobs.ok()) return out;
  for (const RecoveredJob& j : *jobs) {
    if (!job_id.empty() && j.snapshot.job_id != job_id) continue;
    out.push_back(JobRendezvous::Restore(j.snapshot, clock_, opts_.reattach_timeout)->Status());
  }
  return out;
}

void Daemon::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (ticker_) ticker_->Stop();
  if (http_) http_->Stop();
  if (timer_) timer_->Stop();
  // Ends every open stream and cancels store waits, so the services' shutdown
  // cannot hang. A borrowed table is its owner's to shut down (after this).
  if (own_table_) own_table_->Shutdown();
}

void Daemon::StepDown() {
  election_view_.store(nullptr);
  election_.reset();
}

Readiness Daemon::Ready() const {
  if (!etcd_) return {};
  const EtcdElection* election = election_view_.load();
  if (election == nullptr) return {false, "starting", "the election has not started yet"};
  if (!election->LeaseAlive()) {
    return {false, "etcd unreachable",
            absl::StrCat("this replica's etcd lease is not renewed (--etcd_endpoints ",
                         absl::StrJoin(opts_.etcd_endpoints, ",",
                                       [](std::string* out, const HostPort& e) {
                                         out->append(FormatHostPort(e));
                                       }),
                         "); it gets agents again once etcd answers")};
  }
  if (election->leading()) {
    if (!serving_.load()) return {false, "leader", "elected; recovering the jobs from etcd"};
    return {true, "leader", absl::StrCat(advertise_, " leads the control plane")};
  }
  const std::string leader = election->leader();
  if (leader.empty()) return {false, "no leader", "no replica leads yet"};
  return {true, "standby",
          absl::StrCat("the leader is ", leader, "; agents sent here are told so")};
}

}  // namespace ddprun::rendezvous
