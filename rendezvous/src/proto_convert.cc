#include "ddprun/rendezvous/proto_convert.h"

#include <grpc/support/log.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/cord.h"
#include "absl/synchronization/mutex.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/rendezvous/tls_refusal_log.h"

namespace ddprun::rendezvous {
namespace {

// gRPC's own log lines (for example a bind failure) would duplicate our
// one-line errors; DDPRUN_GRPC_LOG=1 lets them through for debugging. A TLS
// server's refused handshakes become our own rate-limited lines.
void DropGrpcLog(gpr_log_func_args* args) {
  NoteGrpcLogLine(args->file, args->severity, args->message);
}

}  // namespace

void SilenceGrpcLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("DDPRUN_GRPC_LOG");
    if (!v || std::string(v) != "1") gpr_set_log_function(DropGrpcLog);
    // What an NDEBUG build of absl does anyway (proto_convert.h).
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  pb::ErrorDetails details;
  details.set_from_server(true);
  s.ForEachPayload([&](absl::string_view type_url, const absl::Cord& value) {
    (*details.mutable_payloads())[std::string(type_url)] = std::string(value);
  });
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      details.SerializeAsString());
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  pb::ErrorDetails details;
  if (!s.error_details().empty() && details.ParseFromString(s.error_details())) {
    for (const auto& [type_url, value] : details.payloads()) {
      out.SetPayload(type_url, absl::Cord(value));
    }
  }
  return out;
}

bool SentByServer(const grpc::Status& s) {
  pb::ErrorDetails details;
  return !s.ok() && !s.error_details().empty() && details.ParseFromString(s.error_details()) &&
         details.from_server();
}

StoreScope FromProto(const pb::StoreScope& p) { return {p.job_id(), p.token(), p.round()}; }

JobPolicy FromProto(const pb::JobPolicy& p) {
  JobPolicy s;
  s.max_restarts = p.max_restarts();
  s.join_timeout_s = p.join_timeout_s();
  s.last_call_timeout_s = p.last_call_timeout_s();
  s.hang_timeout_s = p.hang_timeout_s();
  switch (p.on_hang()) {
    case pb::ON_HANG_RESTART:
      s.on_hang = OnHang::kRestart;
      break;
    case pb::ON_HANG_ABORT:
      s.on_hang = OnHang::kAbort;
      break;
    default:  // ON_HANG_REPORT, or a value this version does not know
      s.on_hang = OnHang::kReport;
      break;
  }
  // RESTART_POLICY_JOB, or a value this version does not know: job.
  s.restart_policy = p.restart_policy() == pb::RESTART_POLICY_INPLACE ? RestartPolicy::kInplace
                                                                      : RestartPolicy::kJob;
  s.ckpt_replicas = p.ckpt_replicas();
  s.ckpt_encrypt = p.ckpt_encrypt();
  return s;
}

void ToProto(const JobPolicy& s, pb::JobPolicy* p) {
  p->set_max_restarts(s.max_restarts);
  p->set_join_timeout_s(s.join_timeout_s);
  p->set_last_call_timeout_s(s.last_call_timeout_s);
  p->set_hang_timeout_s(s.hang_timeout_s);
  switch (s.on_hang) {
    case OnHang::kReport:
      p->set_on_hang(pb::ON_HANG_REPORT);
      break;
    case OnHang::kRestart:
      p->set_on_hang(pb::ON_HANG_RESTART);
      break;
    case OnHang::kAbort:
      p->set_on_hang(pb::ON_HANG_ABORT);
      break;
  }
  p->set_restart_policy(s.restart_policy == RestartPolicy::kInplace ? pb::RESTART_POLICY_INPLACE
                                                                    : pb::RESTART_POLICY_JOB);
  p->set_ckpt_replicas(s.ckpt_replicas);
  p->set_ckpt_encrypt(s.ckpt_encrypt);
}

JoinSpec FromProto(const pb::JoinRequest& p) {
  JoinSpec s;
  s.protocol_version = p.protocol_version();
  s.job_id = p.job_id();
  s.join_token = p.join_token();
  s.host = p.host();
  s.pid = p.pid();
  s.requested_rank = p.requested_rank();
  s.nproc = p.nproc();
  s.min_nodes = p.min_nodes();
  s.max_nodes = p.max_nodes();
  if (p.has_policy()) {
    s.policy = FromProto(p.policy());
  } else {  // written before JobPolicy (see the proto)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    s.policy.max_restarts = p.legacy_max_restarts();
    s.policy.join_timeout_s = p.legacy_join_timeout_s();
    s.policy.last_call_timeout_s = p.legacy_last_call_timeout_s();
    s.policy.hang_timeout_s = p.legacy_hang_timeout_s();
    s.policy.on_hang = ParseOnHang(p.legacy_on_hang()).value_or(OnHang::kReport);
#pragma GCC diagnostic pop
  }
  s.master_port = p.master_port();
  s.command = p.command();
  s.resume_round = p.resume_node_id().empty() ? -1 : p.resume_round();
  s.resume_node_id = p.resume_node_id();
  return s;
}

pb::JoinRequest ToProto(const JoinSpec& s) {
  pb::JoinRequest p;
  p.set_protocol_version(s.protocol_version);
  p.set_job_id(s.job_id);
  p.set_join_token(s.join_token);
  p.set_host(s.host);
  p.set_pid(s.pid);
  p.set_requested_rank(s.requested_rank);
  p.set_nproc(s.nproc);
  p.set_min_nodes(s.min_nodes);
  p.set_max_nodes(s.max_nodes);
  ToProto(s.policy, p.mutable_policy());
  p.set_master_port(s.master_port);
  p.set_command(s.command);
  p.set_resume_round(s.resume_round);
  p.set_resume_node_id(s.resume_node_id);
  return p;
}

WorkerFailure FromProto(const pb::WorkerFailure& p) {
  WorkerFailure f;
  f.host = p.host();
  f.global_rank = p.global_rank();
  f.local_rank = p.local_rank();
  f.exit_code = p.exit_code();
  f.signal = p.signal();
  f.pid = p.pid();
  f.timestamp = p.timestamp();
  f.stderr_tail = p.stderr_tail();
  f.error_message = p.error_message();
  f.round = p.round();
  f.log_file = p.log_file();
  return f;
}

void ToProto(const WorkerFailure& f, pb::WorkerFailure* p) {
  p->set_host(f.host);
  p->set_global_rank(f.global_rank);
  p->set_local_rank(f.local_rank);
  p->set_exit_code(f.exit_code);
  p->set_signal(f.signal);
  p->set_pid(f.pid);
  p->set_timestamp(f.timestamp);
  p->set_stderr_tail(f.stderr_tail);
  p->set_error_message(f.error_message);
  p->set_round(f.round);
  p->set_log_file(f.log_file);
}

NodeInfo FromProto(const pb::NodeInfo& p) {
  return NodeInfo{p.group_rank(), p.host(), p.pid(), p.nproc(), p.base_rank()};
}

void ToProto(const NodeInfo& n, pb::NodeInfo* p) {
  p->set_group_rank(n.group_rank);
  p->set_host(n.host);
  p->set_pid(n.pid);
  p->set_nproc(n.nproc);
  p->set_base_rank(n.base_rank);
}

pb::RoundEvent ToProto(const RoundEvent& e) {
  pb::RoundEvent p;
  if (const auto* a = std::get_if<Assignment>(&e)) {
    auto* q = p.mutable_assignment();
    q->set_job_id(a->job_id);
    q->set_round(a->round);
    q->set_group_rank(a->group_rank);
    q->set_group_world_size(a->group_world_size);
    q->set_base_rank(a->base_rank);
    q->set_world_size(a->world_size);
    q->set_local_world_size(a->local_world_size);
    q->set_master_addr(a->master_addr);
    q->set_master_port(a->master_port);
    q->set_restart_count(a->restart_count);
    q->set_store_token(a->store_token);
    q->set_node_id(a->node_id);
    if (a->policy) ToProto(*a->policy, q->mutable_policy());
  } else if (const auto* r = std::get_if<RestartRound>(&e)) {
    auto* q = p.mutable_restart();
    q->set_next_round(r->next_round);
    q->set_reason(r->reason);
    q->set_counts_as_failure(r->counts_as_failure);
  } else if (const auto* c = std::get_if<JobClosed>(&e)) {
    auto* q = p.mutable_closed();
    q->set_success(c->success);
    q->set_reason(c->reason);
    for (const auto& f : c->failures) ToProto(f, q->add_failures());
  }
  return p;
}

RoundEvent FromProto(const pb::RoundEvent& p) {
  switch (p.event_case()) {
    case pb::RoundEvent::kAssignment: {
      const auto& q = p.assignment();
      Assignment a;
      a.job_id = q.job_id();
      a.round = q.round();
      a.group_rank = q.group_rank();
      a.group_world_size = q.group_world_size();
      a.base_rank = q.base_rank();
      a.world_size = q.world_size();
      a.local_world_size = q.local_world_size();
      a.master_addr = q.master_addr();
      a.master_port = q.master_port();
      a.restart_count = q.restart_count();
      a.store_token = q.store_token();
      a.node_id = q.node_id();
      if (q.has_policy()) a.policy = FromProto(q.policy());
      return a;
    }
    case pb::RoundEvent::kRestart:
      return RestartRound{p.restart().next_round(), p.restart().reason(),
                          p.restart().counts_as_failure()};
    case pb::RoundEvent::kClosed: {
      JobClosed c{p.closed().success(), p.closed().reason(), {}};
      for (const auto& f : p.closed().failures()) c.failures.push_back(FromProto(f));
      return c;
    }
    default:
      return absl::InternalError("the rendezvous server sent an empty event");
  }
}

pb::ReportRequest::Outcome ToProto(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return pb::ReportRequest::SUCCEEDED;
    case Outcome::kFailed:
      return pb::ReportRequest::FAILED;
    case Outcome::kLeaving:
      return pb::ReportRequest::LEAVING;
  }
  return pb::ReportRequest::OUTCOME_UNSPECIFIED;
}

Outcome FromProto(pb::ReportRequest::Outcome o) {
  switch (o) {
    case pb::ReportRequest::SUCCEEDED:
      return Outcome::kSucceeded;
    case pb::ReportRequest::FAILED:
      return Outcome::kFailed;
    default:
      return Outcome::kLeaving;
  }
}

void ToProto(const JobStatus& s, pb::JobStatus* p) {
  p->set_job_id(s.job_id);
  p->set_round(s.round);
  p->set_state(s.state);
  p->set_restart_count(s.restart_count);
  for (const auto& n : s.nodes) ToProto(n, p->add_nodes());
  p->set_world_size(s.world_size);
  p->set_waiting(s.waiting);
  for (const auto& q : s.quarantined) p->add_quarantined(q);
  p->set_min_nodes(s.min_nodes);
  p->set_max_nodes(s.max_nodes);
  p->set_join_deadline_in_s(s.join_deadline_in_s);
}

JobStatus FromProto(const pb::JobStatus& p) {
  JobStatus s;
  s.job_id = p.job_id();
  s.round = p.round();
  s.state = p.state();
  s.restart_count = p.restart_count();
  for (const auto& n : p.nodes()) s.nodes.push_back(FromProto(n));
  s.world_size = p.world_size();
  s.waiting = p.waiting();
  s.quarantined.assign(p.quarantined().begin(), p.quarantined().end());
  s.min_nodes = p.min_nodes();
  s.max_nodes = p.max_nodes();
  s.join_deadline_in_s = p.join_deadline_in_s();
  return s;
}

void ToProto(const RankSample& r, pb::RankSample* p) {
  p->set_rank(r.rank);
  p->set_local_rank(r.local_rank);
  p->set_pid(r.pid);
  p->set_state(r.state);
  p->set_has_progress_source(r.has_progress_source);
  p->set_steps(r.steps);
  for (double s : r.step_seconds) p->add_step_seconds(s);
  p->set_samples_total(r.samples_total);
  p->set_collective_seq(r.collective_seq);
  p->set_in_collective(r.in_collective);
  p->set_collective_op(r.collective_op);
  p->set_comm_seconds_total(r.comm_seconds_total);
  for (const CollectiveStat& c : r.collectives) {
    pb::CollectiveStat* q = p->add_collectives();
    q->set_op(c.op);
    q->set_count(c.count);
    q->set_bytes_total(c.bytes_total);
    q->set_seconds_total(c.seconds_total);
    q->set_busbw_gbps(c.busbw_gbps);
  }
  for (const auto& [name, value] : r.scalars) (*p->mutable_scalars())[name] = value;
  p->set_scalars_dropped(r.scalars_dropped);
  p->set_cpu_percent(r.cpu_percent);
  p->set_rss_bytes(r.rss_bytes);
  p->set_gpu_util_percent(r.gpu_util_percent);
  p->set_gpu_mem_bytes(r.gpu_mem_bytes);
  p->set_reached_store(r.reached_store);
  p->set_has_checkpoint(r.has_checkpoint);
  p->set_checkpoint_step(r.checkpoint_step);
  p->set_checkpoint_bytes(r.checkpoint_bytes);
  p->set_checkpoint_memory_bytes(r.checkpoint_memory_bytes);
}

void ToProto(const StackDump& d, pb::StackDump* p) {
  p->set_rank(d.rank);
  p->set_pid(d.pid);
  p->set_host(d.host);
  p->set_kind(d.kind);
  p->set_text(d.text);
  p->set_error(d.error);
}

pb::MetricsReport ToProto(const MetricsReport& r) {
  pb::MetricsReport p;
  p.set_job_id(r.job_id);
  p.set_node_id(r.node_id);
  p.set_round(r.round);
  p.set_host(r.host);
  p.set_unix_s(r.unix_s);
  for (const RankSample& s : r.ranks) ToProto(s, p.add_ranks());
  for (const StackDump& d : r.stacks) ToProto(d, p.add_stacks());
  for (const std::string& e : r.events) p.add_events(e);
  for (const std::string& k : r.store_waits) p.add_store_waits(k);
  if (r.recovery) {
    const RecoveryBudget& b = *r.recovery;
    pb::RecoveryBudget* q = p.mutable_recovery();
    q->set_failed_round(b.failed_round);
    q->set_round(b.round);
    q->set_cause(b.cause);
    q->set_stopped_ms(b.stopped_ms);
    q->set_round_ms(b.round_ms);
    q->set_started_ms(b.started_ms);
    q->set_first_step_ms(b.first_step_ms);
    q->set_outcome(b.outcome);
  }
  return p;
}

MetricsReply FromProto(const pb::MetricsReply& p) {
  MetricsReply r;
  r.capture_stacks.assign(p.capture_stacks().begin(), p.capture_stacks().end());
  r.hang_report = p.hang_report();
  return r;
}

// The proto report as the hub's domain type, bounded before copying: at
// most as many ranks and stacks as a node can have, events cut by the hub.
MetricsReport FromProto(const pb::MetricsReport& p) {
  MetricsReport r;
  r.job_id = p.job_id();
  r.node_id = p.node_id();
  r.round = p.round();
  r.host = p.host();
  r.unix_s = p.unix_s();
  const int max_ranks = 65536;
  for (int i = 0; i < p.ranks_size() && i < max_ranks; ++i) {
    const auto& s = p.ranks(i);
    RankSample x;
    x.rank = s.rank();
    x.local_rank = s.local_rank();
    x.pid = s.pid();
    x.state = s.state().substr(0, 32);
    x.has_progress_source = s.has_progress_source();
    x.steps = s.steps();
    const int n = std::min(s.step_seconds_size(), static_cast<int>(kMaxStepSecondsPerReport));
    x.step_seconds.assign(s.step_seconds().end() - n, s.step_seconds().end());
    x.samples_total = s.samples_total();
    x.collective_seq = s.collective_seq();
    x.in_collective = s.in_collective();
    x.collective_op = s.collective_op().substr(0, 256);
    x.comm_seconds_total = s.comm_seconds_total();
    for (int c = 0; c < s.collectives_size() && c <= static_cast<int>(kMaxCollectiveOps); ++c) {
      const auto& cs = s.collectives(c);
      x.collectives.push_back({cs.op().substr(0, 256), cs.count(), cs.bytes_total(),
                               cs.seconds_total(), cs.busbw_gbps()});
    }
    std::size_t kept = 0;
    for (const auto& [k, v] : s.scalars()) {
      // The hub keeps kMaxScalarsPerRank valid ones; copy a bounded number.
      if (kept++ >= 4 * kMaxScalarsPerRank || k.size() > kMaxScalarNameBytes) {
        ++x.scalars_dropped;
        continue;
      }
      x.scalars.emplace(k, v);
    }
    x.scalars_dropped += s.scalars_dropped();
    x.cpu_percent = s.cpu_percent();
    x.rss_bytes = s.rss_bytes();
    x.gpu_util_percent = s.gpu_util_percent();
    x.gpu_mem_bytes = s.gpu_mem_bytes();
    x.reached_store = s.reached_store();
    x.has_checkpoint = s.has_checkpoint();
    x.checkpoint_step = s.checkpoint_step();
    x.checkpoint_bytes = s.checkpoint_bytes();
    x.checkpoint_memory_bytes = s.checkpoint_memory_bytes();
    r.ranks.push_back(std::move(x));
  }
  for (int i = 0; i < p.stacks_size() && i < 64; ++i) {
    const auto& d = p.stacks(i);
    r.stacks.push_back({d.rank(), d.pid(), d.host().substr(0, 1024), d.kind().substr(0, 64),
                        d.text().substr(0, kMaxStackBytes), d.error().substr(0, kMaxEventBytes)});
  }
  for (int i = 0; i < p.events_size() && i < static_cast<int>(kMaxEventsPerReport); ++i) {
    r.events.push_back(p.events(i).substr(0, kMaxEventBytes));
  }
  for (int i = 0; i < p.store_waits_size() && i < static_cast<int>(kMaxStoreWaitKeys); ++i) {
    r.store_waits.push_back(p.store_waits(i).substr(0, kMaxStoreKeyBytes));
  }
  if (p.has_recovery()) {
    const pb::RecoveryBudget& q = p.recovery();
    RecoveryBudget b;
    b.failed_round = q.failed_round();
    b.round = q.round();
    b.cause = q.cause().substr(0, kMaxEventBytes);
    b.stopped_ms = q.stopped_ms();
    b.round_ms = q.round_ms();
    b.started_ms = q.started_ms();
    b.first_step_ms = q.first_step_ms();
    b.outcome = q.outcome().substr(0, 32);
    r.recovery = std::move(b);
  }
  return r;
}

void ToProto(const MetricsReply& r, pb::MetricsReply* p) {
  for (int rank : r.capture_stacks) p->add_capture_stacks(rank);
  p->set_hang_report(r.hang_report);
}

}  // namespace ddprun::rendezvous
