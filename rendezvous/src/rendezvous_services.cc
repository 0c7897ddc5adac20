// The Rendezvous and Store gRPC services (rendezvous_services.h): the Join
// streams (JoinCall and its Sink, on the async API), the unary methods, and
// the gRPC server with its Join queues. Every call goes to the
// ServiceBackend.
#include "ddprun/rendezvous/rendezvous_services.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "completion_queues.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/metrics_service.h"
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
// How long a connection may take to finish its TLS and HTTP/2 handshake.
constexpr int kHandshakeTimeoutMs = 10'000;

class GrpcServices::Impl {
 public:
  Impl(const GrpcServicesOptions& opts, ServiceBackend& backend) : opts_(opts), backend_(backend) {}
  ~Impl() { Shutdown(); }

  absl::Status Start();
  void Shutdown();
  int port() const { return port_; }
  void HandOver(int fd, const std::string& first_bytes);
  ServiceBackend& backend() { return backend_; }
  // Asks for one more Join call on queue `q`, unless the server shuts down.
  void RequestJoin(int q);

 private:
  void StopJoinQueues();

  GrpcServicesOptions opts_;
  ServiceBackend& backend_;
  int port_ = 0;
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
  bool shut_down_ = false;  // Shutdown() ran
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
  JoinCall(GrpcServices::Impl* impl, RendezvousAsyncJoin* service, grpc::ServerCompletionQueue* cq,
           int q)
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
    JobTable& table = impl_->backend().table();
    if (absl::Status gate = impl_->backend().Gate(); !gate.ok()) {
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
        impl_->backend().table().Unregister(job, node, sink_.get());
      } else {
        ServiceBackend& backend = impl_->backend();
        backend.table().StreamLost(job, node, sink_.get(), backend.LostStreamHold());
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

  GrpcServices::Impl* impl_;
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
  explicit RendezvousServiceImpl(GrpcServices::Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx, const pb::ReportRequest* req,
                                   pb::ReportResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status gate = impl_->backend().Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    std::vector<WorkerFailure> failures;
    for (const auto& f : req->failures()) failures.push_back(FromProto(f));
    reactor->Finish(
        ToGrpc(impl_->backend().table().Report(req->job_id(), req->node_id(), req->round(),
                                               FromProto(req->outcome()), std::move(failures))));
    return reactor;
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const pb::StatusRequest* req,
                                   pb::StatusResponse* resp) override {
    // A standby answers from its journal: every replica shows the same jobs.
    const std::vector<JobStatus> jobs = impl_->backend().Gate().ok()
                                            ? impl_->backend().table().Status(req->job_id())
                                            : impl_->backend().StandbyStatus(req->job_id());
    for (const auto& s : jobs) ToProto(s, resp->add_jobs());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Monitoring: metrics_service.cc.
  grpc::ServerUnaryReactor* ReportMetrics(grpc::CallbackServerContext* ctx,
                                          const pb::MetricsReport* req,
                                          pb::MetricsReply* resp) override {
    return HandleReportMetrics(impl_->backend().hub(), ctx, req, resp);
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx,
                                       const pb::MetricsQuery* req,
                                       pb::MetricsView* resp) override {
    return HandleGetMetrics(impl_->backend().hub(), ctx, req, resp);
  }

 private:
  GrpcServices::Impl* impl_;
};

class StoreServiceImpl final : public pb::Store::CallbackService {
 public:
  explicit StoreServiceImpl(GrpcServices::Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const pb::SetRequest* req,
                                pb::SetResponse*) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) {
      DDPRUN_RETURN_IF_ERROR(
          impl_->backend().table().CheckStoreValue(scope, req->key(), req->value().size()));
      DDPRUN_RETURN_IF_ERROR(e.Set(req->key(), req->value()));
      return impl_->backend().table().PersistKey(scope, req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) -> absl::Status {
      DDPRUN_ASSIGN_OR_RETURN(const std::int64_t value, e.Add(req->key(), req->delta()));
      resp->set_value(value);
      return impl_->backend().table().PersistKey(scope, req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const pb::CompareSetRequest* req,
                                       pb::CompareSetResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) -> absl::Status {
      DDPRUN_RETURN_IF_ERROR(
          impl_->backend().table().CheckStoreValue(scope, req->key(), req->desired().size()));
      std::optional<std::string> expected;
      if (!req->expect_absent()) expected = req->expected();
      DDPRUN_ASSIGN_OR_RETURN(CompareSetResult r,
                              e.CompareSet(req->key(), expected, req->desired()));
      resp->set_swapped(r.swapped);
      resp->set_current(std::move(r.current));
      return r.swapped ? impl_->backend().table().PersistKey(scope, req->key(), e)
                       : absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const pb::DeleteRequest* req,
                                   pb::DeleteResponse* resp) override {
    return Run(ctx, req->scope(), [&](const StoreScope& scope, KvEngine& e) {
      resp->set_deleted(e.Delete(req->key()));
      return resp->deleted() ? impl_->backend().table().PersistKey(scope, req->key(), e)
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
    if (absl::Status gate = impl_->backend().Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    const StoreScope s = FromProto(scope);
    auto engine = impl_->backend().table().StoreFor(s);
    reactor->Finish(ToGrpc(engine.ok() ? op(s, **engine) : engine.status()));
    return reactor;
  }

  // Waits (without blocking a thread) for keys, then runs then(engine).
  template <typename F>
  grpc::ServerUnaryReactor* RunWait(grpc::CallbackServerContext* ctx, const pb::StoreScope& scope,
                                    std::vector<std::string> keys, double timeout_s, F then) {
    auto* reactor = ctx->DefaultReactor();
    if (absl::Status gate = impl_->backend().Gate(); !gate.ok()) {
      reactor->Finish(ToGrpc(gate));
      return reactor;
    }
    auto engine = impl_->backend().table().StoreFor(FromProto(scope));
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
    impl_->backend().table().WaitAsync(
        *e, std::move(keys), impl_->backend().Now() + ClampTimeout(timeout_s),
        [reactor, e, then, shown](absl::Status st) mutable {
          if (st.ok()) {
            st = then(*e);
          } else if (absl::IsDeadlineExceeded(st)) {
            st = absl::DeadlineExceededError("store wait timed out after " + std::to_string(shown) +
                                             " s");
          }
          reactor->Finish(ToGrpc(st));
        });
    return reactor;
  }

  GrpcServices::Impl* impl_;
};

}  // namespace

// ------------------------------------------------------------ Server

absl::Status GrpcServices::Impl::Start() {
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
  // A client that connects and never completes the TLS/HTTP2 handshake is
  // dropped after 10 s (gRPC's default is 120 s): strangers hold a connection
  // for a bounded time (docs/security.md).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
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
  return absl::OkStatus();
}

void GrpcServices::Impl::RequestJoin(int q) {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (!accepting_joins_) return;
  new JoinCall(this, rdzv_service_.get(), join_queues_[q].get(), q);  // deletes itself
}

void GrpcServices::Impl::StopJoinQueues() {
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

void GrpcServices::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(join_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    accepting_joins_ = false;
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
  // After the server: its calls have ended, so their last tags are queued.
  StopJoinQueues();
}

void GrpcServices::Impl::HandOver(int fd, const std::string& first_bytes) {
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

GrpcServices::GrpcServices(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcServices::~GrpcServices() = default;

absl::StatusOr<std::unique_ptr<GrpcServices>> GrpcServices::Start(const GrpcServicesOptions& opts,
                                                                  ServiceBackend& backend) {
  auto impl = std::make_unique<Impl>(opts, backend);
  DDPRUN_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<GrpcServices>(new GrpcServices(std::move(impl)));
}

int GrpcServices::port() const { return impl_->port(); }
void GrpcServices::HandOver(int fd, const std::string& first_bytes) {
  impl_->HandOver(fd, first_bytes);
}
void GrpcServices::Shutdown() { impl_->Shutdown(); }

}  // namespace ddprun::rendezvous
