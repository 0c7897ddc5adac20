// The gRPC adapter: the Rendezvous and Store services convert protos at the
// edge and call the JobTable (job_table.h), which holds every job; a
// DeadlineTimer applies the table's deadlines. Stream writes go through
// Sinks that outlive their reactors.
#include "ddprun/rendezvous/daemon/server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "completion_queues.h"
#include "ddprun/rendezvous/common/deadline_timer.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/ha/etcd_election.h"
#include "ddprun/rendezvous/ha/etcd_journal.h"
#include "ddprun/rendezvous/ha/state_log.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/metrics_service.h"
#include "ddprun/rendezvous/monitoring/hang_action.h"
#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/hub_ticker.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/rendezvous/monitoring/monitoring_routes.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/rendezvous/store/kv_engine.h"
#include "ddprun/rendezvous/tls_credentials.h"
#include "ddprun/rendezvous/tls_refusal_log.h"
#include "ddprun/v1/ddprun.grpc.pb.h"

namespace ddprun::rendezvous {
namespace {

// A store wait's timeout from the wire (seconds) as a duration: 0 for a
// non-positive or NaN value, at most kMaxTimeout.
Duration ClampTimeout(double seconds) {
  if (!(seconds > 0)) return Duration::zero();
  return Seconds(std::min(seconds, std::chrono::duration<double>(kMaxTimeout).count()));
}

}  // namespace

// ------------------------------------------------------------------ Sinks

class JoinCall;

// The write side of one Join stream. Shared by the reactor and the job table,
// so deliveries never touch a reactor that is gone.
class Sink final : public EventSink {
 public:
  explicit Sink(JoinCall* call) : call_(call) {}
  void Bind(const std::string& job_id, const std::string& node_id) override;
  void Deliver(RoundEvent event) override;

  std::mutex mu;
  // Called with mu held, by the call when it ends.
  void DetachLocked() { call_ = nullptr; }

 private:
  JoinCall* call_;  // null once the call has ended
};

// The Rendezvous service: Join on the async API (JoinCall, below; the
// streams live long, completion_queues.h says why), every other method on
// the callback API.
using RendezvousAsyncJoin =
    pb::Rendezvous::WithAsyncMethod_Join<pb::Rendezvous::WithCallbackMethod_Report<
        pb::Rendezvous::WithCallbackMethod_Status<pb::Rendezvous::WithCallbackMethod_ReportMetrics<
            pb::Rendezvous::WithCallbackMethod_GetMetrics<pb::Rendezvous::Service>>>>>;

// Join streams are spread over this many completion queues, each drained by
// a thread of its own: a completion scans the tags of its queue only. One
// per two cores, at least 1 and at most 8: each queue's thread also polls the
// network, as do gRPC's own threads of the callback queue (one per core), and
// a completion found by another thread is handed over with a wake-up. On
// this 2-core machine 4 queues measured more CPU and context switches than 2,
// and 1 less server CPU than 2 (rendezvous_bench --split 16384: 690-770 ms
// against 760-1000; docs/benchmarks.md).
static int JoinQueueCount() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
}
// Join calls requested in advance on each queue (how many agents' streams
// can be accepted at once before the next request is posted).
constexpr int kJoinRequestsPerQueue = 32;

class RendezvousServer::Impl {
 public:
  explicit Impl(const ServerOptions& opts);
  ~Impl() { Shutdown(); }

  absl::Status Start();
  void Shutdown();
  void Wait() {
    std::unique_lock<std::mutex> lock(shutdown_mu_);
    shutdown_cv_.wait(lock, [&] { return shutting_down_; });
  }
  int port() const { return port_; }
  int dashboard_port() const { return http_ ? http_->port() : -1; }
  JobTable& table() { return *table_; }
  MetricsHub& hub() { return *hub_; }
  void HandOver(int fd, const std::string& first_bytes);
  TimePoint Now() const { return clock_.Now(); }
  // OK where this server serves jobs: always, but a replica of the etcd
  // control plane only while it leads. Otherwise Unavailable naming the leader.
  absl::Status Gate() const;
  // Every job (or one) as etcd holds it, for a standby's `ddprun status`.
  std::vector<JobStatus> StatusFromEtcd(const std::string& job_id) const;
  // Asks for one more Join call on queue `q`, unless the server shuts down.
  void RequestJoin(int q);

 private:
  ServerOptions opts_;
  const Clock& clock_;
  int port_ = 0;
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
  std::atomic<bool> serving_{true};
  absl::Status StartEtcd();
  void OnElected(std::int64_t revision);
  void OnDeposed(const absl::Status& why);
  std::unique_ptr<JobTable> own_table_;    // unless opts_.table is given
  JobTable* table_ = nullptr;              // own_table_ or opts_.table
  std::unique_ptr<DeadlineTimer> timer_;  // before the services: reactors notify it
  // With opts_.external_connections: where HandOver() sends connections.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;

  // Services outlive the server that calls them (members die in reverse order).
  std::unique_ptr<RendezvousAsyncJoin> rdzv_service_;
  std::unique_ptr<grpc::Service> store_service_;
  std::unique_ptr<grpc::Server> server_;
  // The Join streams' queues and their threads. join_mu_ orders requests for
  // new calls against shutdown: none is posted once accepting_joins_ is false.
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> join_queues_;
  std::vector<std::thread> join_threads_;
  std::mutex join_mu_;
  bool accepting_joins_ = false;
  void StopJoinQueues();

  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutting_down_ = false;

  // Monitoring: the hub's one-second ticker (series points, hang deadlines)
  // and the HTTP port.
  std::unique_ptr<HubTicker> ticker_;
  std::unique_ptr<HttpServer> http_;
};

// One Join call on the async API: writes queued RoundEvents in order, one
// write at a time; a terminal event (restart, closed, error) finishes the
// stream. An open stream holds one operation on its queue (the notification
// that the call is done: the agent went away, or the stream finished); a
// write or the Finish adds one while it runs. The call deletes itself when
// it is done and no operation of its own is left.
class JoinCall final {
 public:
  // Requests the next Join call on queue `q` (Impl::RequestJoin).
  JoinCall(RendezvousServer::Impl* impl, RendezvousAsyncJoin* service,
           grpc::ServerCompletionQueue* cq, int q)
      : impl_(impl), q_(q), writer_(&ctx_), sink_(std::make_shared<Sink>(this)) {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service->RequestJoin(&ctx_, &request_, &writer_, cq, cq, &requested_tag_);
  }

  // Called with sink_->mu held.
  void SetNodeLocked(std::string job_id, std::string node_id) {
    job_id_ = std::move(job_id);
    node_id_ = std::move(node_id);
  }

  // Called with sink_->mu held.
  void PushLocked(RoundEvent event) {
    if (finishing_) return;
    if (auto* st = std::get_if<absl::Status>(&event)) {
      terminal_queued_ = true;
      final_status_ = ToGrpc(*st);
    } else {
      if (!std::holds_alternative<Assignment>(event)) terminal_queued_ = true;
      queue_.push_back(ToProto(event));
    }
    if (!writing_) StartNextLocked();
  }

 private:
  // An agent's Join arrived (or, !ok, the server shuts down and the request
  // is returned unused: no other tag of this call will come).
  void OnRequested(bool ok) {
    if (!ok) {
      delete this;
      return;
    }
    impl_->RequestJoin(q_);  // the next agent's
    JobTable& table = impl_->table();
    if (absl::Status gate = impl_->Gate(); !gate.ok()) {
      FailNow(gate);
      return;
    }
    auto node = table.Join(FromProto(request_), sink_);
    if (!node.ok()) FailNow(node.status());
  }

  void FailNow(const absl::Status& st) {
    std::lock_guard<std::mutex> lock(sink_->mu);
    PushLocked(st);
  }

  void OnWriteDone(bool ok) {
    std::unique_lock<std::mutex> lock(sink_->mu);
    writing_ = false;
    if (ok) {
      StartNextLocked();
    } else {
      finishing_ = true;  // the agent went away; the done notification reports the loss
    }
    EndIfDone(lock);
  }

  void OnFinishDone(bool) {
    std::unique_lock<std::mutex> lock(sink_->mu);
    writing_ = false;
    EndIfDone(lock);
  }

  // The call is over: finished, or cancelled (the agent went away, its
  // connection broke, or the server shuts down).
  void OnDone(bool) {
    std::unique_lock<std::mutex> lock(sink_->mu);
    call_done_ = true;
    finishing_ = true;  // a cancelled call takes no more writes
    EndIfDone(lock);
  }

  // Once the call is done and no write or Finish of ours is outstanding: a
  // stream that ended without a terminal event lost its agent (StreamLost
  // ignores a sink that is no longer current, so this is idempotent); then
  // the call deletes itself.
  void EndIfDone(std::unique_lock<std::mutex>& lock) {
    if (!call_done_ || writing_) return;
    sink_->DetachLocked();
    const std::string job = job_id_, node = node_id_;
    const bool clean = terminal_queued_;
    lock.unlock();
    if (!node.empty()) {
      if (clean) {
        impl_->table().Unregister(job, node, sink_.get());
      } else {
        impl_->table().StreamLost(job, node, sink_.get());
      }
    }
    delete this;
  }

  // Called with sink_->mu held. `writing_` covers the Finish too.
  void StartNextLocked() {
    if (finishing_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.erase(queue_.begin());
      writing_ = true;
      writer_.Write(current_, &write_tag_);
      return;
    }
    if (terminal_queued_) {
      finishing_ = true;
      writing_ = true;
      writer_.Finish(final_status_, &finish_tag_);
    }
  }

  RendezvousServer::Impl* impl_;
  const int q_;
  grpc::ServerContext ctx_;
  pb::JoinRequest request_;
  grpc::ServerAsyncWriter<pb::RoundEvent> writer_;
  MemberTag<JoinCall, &JoinCall::OnRequested> requested_tag_{this};
  MemberTag<JoinCall, &JoinCall::OnWriteDone> write_tag_{this};
  MemberTag<JoinCall, &JoinCall::OnFinishDone> finish_tag_{this};
  MemberTag<JoinCall, &JoinCall::OnDone> done_tag_{this};
  std::shared_ptr<Sink> sink_;
  std::string job_id_, node_id_;
  // Events not yet written, oldest first: rarely more than one (an
  // Assignment, then RestartRound or the end). A vector allocates nothing
  // until the first; a deque took ~600 bytes per open stream up front.
  std::vector<pb::RoundEvent> queue_;
  pb::RoundEvent current_;
  bool writing_ = false;  // a Write or the Finish is outstanding
  bool terminal_queued_ = false;
  bool finishing_ = false;  // no more writes: finishing, or the call is done
  bool call_done_ = false;
  grpc::Status final_status_ = grpc::Status::OK;
};

void Sink::Bind(const std::string& job_id, const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu);
  if (call_) call_->SetNodeLocked(job_id, node_id);
}

void Sink::Deliver(RoundEvent event) {
  std::lock_guard<std::mutex> lock(mu);
  if (call_) call_->PushLocked(std::move(event));
}

// ------------------------------------------------------------ Services

namespace {

// Join is served by JoinCall; the unary methods here.
class RendezvousServiceImpl final : public RendezvousAsyncJoin {
 public:
  explicit RendezvousServiceImpl(RendezvousServer::Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx,
                                   const pb::ReportRequest* req,
                                   pb::ReportResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status gate = impl_->Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    std::vector<WorkerFailure> failures;
    for (const auto& f : req->failures()) failures.push_back(FromProto(f));
    reactor->Finish(ToGrpc(impl_->table().Report(req->job_id(), req->node_id(), req->round(),
                                                 FromProto(req->outcome()), std::move(failures))));
    return reactor;
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const pb::StatusRequest* req,
                                   pb::StatusResponse* resp) override {
    // A standby answers from etcd: every replica shows the same jobs.
    const std::vector<JobStatus> jobs = impl_->Gate().ok()
                                            ? impl_->table().Status(req->job_id())
                                            : impl_->StatusFromEtcd(req->job_id());
    for (const auto& s : jobs) ToProto(s, resp->add_jobs());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Monitoring: metrics_service.cc.
  grpc::ServerUnaryReactor* ReportMetrics(grpc::CallbackServerContext* ctx,
                                          const pb::MetricsReport* req,
                                          pb::MetricsReply* resp) override {
    return HandleReportMetrics(impl_->hub(), ctx, req, resp);
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx,
                                       const pb::MetricsQuery* req,
                                       pb::MetricsView* resp) override {
    return HandleGetMetrics(impl_->hub(), ctx, req, resp);
  }

 private:
  RendezvousServer::Impl* impl_;
};

class StoreServiceImpl final : public pb::Store::CallbackService {
 public:
  explicit StoreServiceImpl(RendezvousServer::Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const pb::SetRequest* req,
                                pb::SetResponse*) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) {
      DDPRUN_RETURN_IF_ERROR(
          impl_->table().CheckStoreValue(scope, req->key(), req->value().size()));
      DDPRUN_RETURN_IF_ERROR(e.Set(req->key(), req->value()));
      return impl_->table().PersistKey(scope, req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) -> absl::Status {
      DDPRUN_ASSIGN_OR_RETURN(const std::int64_t value, e.Add(req->key(), req->delta()));
      resp->set_value(value);
      return impl_->table().PersistKey(scope, req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const pb::CompareSetRequest* req,
                                       pb::CompareSetResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) -> absl::Status {
      DDPRUN_RETURN_IF_ERROR(
          impl_->table().CheckStoreValue(scope, req->key(), req->desired().size()));
      std::optional<std::string> expected;
      if (!req->expect_absent()) expected = req->expected();
      DDPRUN_ASSIGN_OR_RETURN(CompareSetResult r,
                              e.CompareSet(req->key(), expected, req->desired()));
      resp->set_swapped(r.swapped);
      resp->set_current(std::move(r.current));
      return r.swapped ? impl_->table().PersistKey(scope, req->key(), e) : absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const pb::DeleteRequest* req,
                                   pb::DeleteResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) {
      resp->set_deleted(e.Delete(req->key()));
      return resp->deleted() ? impl_->table().PersistKey(scope, req->key(), e)
                             : absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetRequest* req,
                                pb::GetResponse* resp) override {
    return RunWait(ctx, req->scope(), {req->key()}, req->timeout_s(),
                   [req, resp](KvEngine& e) -> absl::Status {
                     auto v = e.Get(req->key());
                     if (!v) return absl::NotFoundError("key '" + req->key() + "' was deleted");
                     resp->set_value(std::move(*v));
                     return absl::OkStatus();
                   });
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const pb::WaitRequest* req,
                                 pb::WaitResponse*) override {
    return RunWait(ctx, req->scope(), {req->keys().begin(), req->keys().end()}, req->timeout_s(),
                   [](KvEngine&) { return absl::OkStatus(); });
  }

  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx,
                                     const pb::MultiGetRequest* req,
                                     pb::MultiGetResponse* resp) override {
    return RunWait(ctx, req->scope(), {req->keys().begin(), req->keys().end()}, req->timeout_s(),
                   [req, resp](KvEngine& e) -> absl::Status {
                     for (const auto& k : req->keys()) {
                       auto v = e.Get(k);
                       if (!v) return absl::NotFoundError("key '" + k + "' was deleted");
                       resp->add_values(std::move(*v));
                     }
                     return absl::OkStatus();
                   });
  }

 private:
  template <typename F>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const pb::StoreScope& scope,
                                F&& op) {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status gate = impl_->Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    const StoreScope s = FromProto(scope);
    auto engine = impl_->table().StoreFor(s);
    reactor->Finish(ToGrpc(engine.ok() ? op(s, **engine) : engine.status()));
    return reactor;
  }

  // Waits (without blocking a thread) for keys, then runs then(engine).
  template <typename F>
  grpc::ServerUnaryReactor* RunWait(grpc::CallbackServerContext* ctx,
                                    const pb::StoreScope& scope, std::vector<std::string> keys,
                                    double timeout_s, F then) {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status gate = impl_->Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    auto engine = impl_->table().StoreFor(FromProto(scope));
    if (!engine.ok()) {
      reactor->Finish(ToGrpc(engine.status()));
      return reactor;
    }
    if (keys.size() > kMaxWaitKeys) {
      reactor->Finish(ToGrpc(absl::InvalidArgumentError("too many keys in one wait")));
      return reactor;
    }
    for (const auto& k : keys) {
      if (absl::Status st = KvEngine::CheckKey(k); !st.ok()) {
        reactor->Finish(ToGrpc(st));
        return reactor;
      }
    }
    std::shared_ptr<KvEngine> e = *engine;
    const double shown = timeout_s;
    impl_->table().WaitAsync(*e, std::move(keys), impl_->Now() + ClampTimeout(timeout_s),
                             [reactor, e, then, shown](absl::Status st) mutable {
                               if (st.ok()) {
                                 st = then(*e);
                               } else if (absl::IsDeadlineExceeded(st)) {
                                 st = absl::DeadlineExceededError("store wait timed out after " +
                                                                  std::to_string(shown) + " s");
                               }
                               reactor->Finish(ToGrpc(st));
                             });
    return reactor;
  }

  RendezvousServer::Impl* impl_;
};

}  // namespace

// ---------------------------------------------------------------- Impl

RendezvousServer::Impl::Impl(const ServerOptions& opts) : opts_(opts), clock_(*opts.clock) {}

absl::Status RendezvousServer::Impl::Start() {
  SilenceGrpcLogging();
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

  const int lease_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease_timeout).count());
  rdzv_service_ = std::make_unique<RendezvousServiceImpl>(this);
  store_service_ = std::make_unique<StoreServiceImpl>(this);
  grpc::ServerBuilder builder;
  const std::string addr = FormatHostPort(opts_.host, opts_.port);
  if (opts_.external_connections) {
    acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        MakeServerCredentials(opts_.tls));
    port_ = opts_.port;
  } else {
    builder.AddListeningPort(addr, MakeServerCredentials(opts_.tls), &port_);
  }
  // gRPC sets SO_REUSEPORT by default, which would let two servers share a
  // port silently. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive pings detect a silent peer (cut network) within the lease.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, std::max(100, lease_ms / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(100, lease_ms / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // No BDP probing (client.cc's MakeChannel says why): with it, a connection
  // that receives data sends a PING and answers the peer's, 3 more syscalls
  // per agent on the daemon when each agent has a connection of its own.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(rdzv_service_.get());
  builder.RegisterService(store_service_.get());
  for (int q = 0; q < JoinQueueCount(); ++q) join_queues_.push_back(builder.AddCompletionQueue());
  server_ = builder.BuildAndStart();
  if (server_ && port_ != 0) {
    for (std::size_t q = 0; q < join_queues_.size(); ++q) {
      join_threads_.emplace_back([cq = join_queues_[q].get()] { DrainQueue(cq); });
    }
    {
      std::lock_guard<std::mutex> lock(join_mu_);
      accepting_joins_ = true;
    }
    for (std::size_t q = 0; q < join_queues_.size(); ++q) {
      for (int i = 0; i < kJoinRequestsPerQueue; ++i) RequestJoin(static_cast<int>(q));
    }
  }
  if (server_ && port_ != 0 && opts_.tls.enabled) {
    ArmTlsRefusalLog(opts_.log_prefix, opts_.client_ca_flag);
  }
  if (!server_ || port_ == 0) {
    server_.reset();
    StopJoinQueues();
    // Find out why, for a useful message.
    std::string why = "cannot bind";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(opts_.port));
    if (fd >= 0 && inet_pton(AF_INET, opts_.host.c_str(), &sa.sin_addr) == 1 &&
        bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      why = std::strerror(errno);
      for (auto& c : why) c = static_cast<char>(std::tolower(c));
    }
    if (fd >= 0) close(fd);
    return absl::UnavailableError("cannot listen on " + addr + ": " + why + "; " +
                                  opts_.listen_fix);
  }
  if (own_hub_ && opts_.dashboard_port >= 0) {
    HttpServerOptions ho;
    ho.host = opts_.dashboard_host.empty() ? opts_.host : opts_.dashboard_host;
    ho.port = opts_.dashboard_port;
    ho.listen_fix = opts_.dashboard_listen_fix;
    MetricsHub* hub = hub_;
    auto http = HttpServer::Start(ho, [hub](const std::string& target) {
      return ServeMonitoring(*hub, target);
    });
    if (!http.ok()) {
      Shutdown();
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
      advertise_ = FormatHostPort(any ? std::string(name) : opts_.host, port_);
    }
    EtcdElectionOptions eo;
    eo.client = etcd_.get();
    eo.prefix = etcd_prefix_;
    eo.address = advertise_;
    eo.lease_ttl_s = opts_.etcd_lease_ttl_s;
    eo.on_elected = [this](std::int64_t revision) { OnElected(revision); };
    eo.on_deposed = [this](absl::Status why) { OnDeposed(why); };
    election_ = std::make_unique<EtcdElection>(std::move(eo));
  }
  return absl::OkStatus();
}

absl::Status RendezvousServer::Impl::StartEtcd() {
  DDPRUN_ASSIGN_OR_RETURN(etcd_prefix_, NormalizeEtcdPrefix(opts_.etcd_prefix));
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

void RendezvousServer::Impl::OnElected(std::int64_t revision) {
  etcd_journal_->SetLeaderRevision(revision);
  if (absl::Status st = table_->Recover(); !st.ok()) {
    OnDeposed(st);
    return;
  }
  if (auto next = table_->NextDeadline()) timer_->Notify(*next);
  serving_ = true;
  std::cerr << "ddprund: " << advertise_ << " leads the control plane (etcd prefix "
            << etcd_prefix_ << ", leader revision " << revision << ")" << std::endl;
}

void RendezvousServer::Impl::OnDeposed(const absl::Status& why) {
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

void RendezvousServer::Impl::RequestJoin(int q) {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (!accepting_joins_) return;
  new JoinCall(this, rdzv_service_.get(), join_queues_[q].get(), q);  // deletes itself
}

void RendezvousServer::Impl::StopJoinQueues() {
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    accepting_joins_ = false;
  }
  for (auto& cq : join_queues_) cq->Shutdown();
  if (join_threads_.empty()) {
    for (auto& cq : join_queues_) DrainQueue(cq.get());  // never served: empty
  }
  for (auto& t : join_threads_) t.join();
  join_threads_.clear();
  join_queues_.clear();
}

absl::Status RendezvousServer::Impl::Gate() const {
  if (serving_.load()) return absl::OkStatus();
  const std::string leader = election_ ? election_->leader() : "";
  return absl::UnavailableError(absl::StrCat(
      "ddprund at ", advertise_, " is a standby replica; ",
      leader.empty() ? std::string("no replica leads yet (is etcd reachable?)")
                     : "the leader is " + leader,
      " (etcd prefix ", etcd_prefix_,
      "); give agents every replica in --rdzv_endpoint and they move on by themselves"));
}

std::vector<JobStatus> RendezvousServer::Impl::StatusFromEtcd(const std::string& job_id) const {
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

void RendezvousServer::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  shutdown_cv_.notify_all();
  if (ticker_) ticker_->Stop();
  if (http_) http_->Stop();
  if (timer_) timer_->Stop();
  // Ends every open stream and cancels store waits, so Shutdown cannot hang.
  // A borrowed table is its owner's to shut down (after this server).
  if (own_table_) own_table_->Shutdown();
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    accepting_joins_ = false;
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
  // After the server: its calls have ended, so their last tags are queued.
  StopJoinQueues();
  // Last: a leader revokes its lease, and a standby takes over at once.
  election_.reset();
}

void RendezvousServer::Impl::HandOver(int fd, const std::string& first_bytes) {
  if (!acceptor_) {
    close(fd);
    return;
  }
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.fd = fd;
  if (!first_bytes.empty()) {
    grpc::Slice slice(first_bytes);
    p.read_buffer = grpc::ByteBuffer(&slice, 1);
  }
  acceptor_->HandleNewConnection(&p);
}

// -------------------------------------------------------------- Facade

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
std::vector<JobStatus> RendezvousServer::Status() const { return impl_->table().Status(); }

}  // namespace ddprun::rendezvous
