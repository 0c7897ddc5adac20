// The gRPC adapter: converts protos at the edge and drives one JobRendezvous
// and one KvEngine per job. All job state is guarded by Impl::mu_; stream
// writes happen outside it, through Sinks that outlive their reactors.
#include "ddprun/rendezvous/server.h"

#include <arpa/inet.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "ddprun/rendezvous/errors.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/kv_engine.h"
#include "ddprun/v1/ddprun.grpc.pb.h"
#include "proto_convert.h"
#include "state_log.h"

namespace ddprun::rendezvous {
namespace {

// Bounds on what a stranger may ask for.
constexpr std::size_t kMaxJobIdBytes = 256;
constexpr int kMaxNproc = 65536;
constexpr int kMaxNodes = 1 << 20;
constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;
constexpr std::size_t kMaxJobs = 100000;
// How long a finished job stays visible to Status before it is forgotten.
constexpr Duration kClosedJobRetention = std::chrono::minutes(10);

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty())
    return absl::InvalidArgumentError("missing job id; pass --rdzv_id");
  if (job_id.size() > kMaxJobIdBytes)
    return absl::InvalidArgumentError("job id longer than 256 bytes; use a shorter --rdzv_id");
  return absl::OkStatus();
}

absl::Status ValidateJoin(const JoinSpec& s) {
  DDPRUN_RETURN_IF_ERROR(ValidateJobId(s.job_id));
  const std::string fence = Fence(s.job_id, -1);
  if (s.host.empty() || s.host.size() > 1024)
    return absl::InvalidArgumentError(fence + "join without a host address");
  if (s.nproc < 1 || s.nproc > kMaxNproc)
    return absl::InvalidArgumentError(fence + "nproc " + std::to_string(s.nproc) +
                                      " is out of range 1.." + std::to_string(kMaxNproc));
  if (s.min_nodes < 1 || s.max_nodes < s.min_nodes || s.max_nodes > kMaxNodes)
    return absl::InvalidArgumentError(fence + "bad node counts " + std::to_string(s.min_nodes) +
                                      ":" + std::to_string(s.max_nodes) +
                                      "; need 0 < MIN <= MAX");
  if (!(s.join_timeout_s > 0 && s.join_timeout_s <= kMaxTimeoutS) ||
      !(s.last_call_timeout_s >= 0 && s.last_call_timeout_s <= kMaxTimeoutS))
    return absl::InvalidArgumentError(fence + "join or last-call timeout out of range");
  if (s.max_restarts < 0 || s.requested_rank < -1 || s.master_port < 0 || s.master_port > 65535)
    return absl::InvalidArgumentError(fence + "malformed join request");
  return absl::OkStatus();
}

// gRPC's own log lines (for example a bind failure) would duplicate our
// one-line errors; DDPRUN_GRPC_LOG=1 lets them through for debugging.
void DropGrpcLog(gpr_log_func_args*) {}

Duration ClampTimeout(double seconds) {
  if (!(seconds > 0)) return Duration::zero();
  return Seconds(std::min(seconds, kMaxTimeoutS));
}

}  // namespace

void SilenceGrpcLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("DDPRUN_GRPC_LOG");
    if (!v || std::string(v) != "1") gpr_set_log_function(DropGrpcLog);
  });
}

// ------------------------------------------------------------------ Sinks

class JoinReactor;

// The write side of one Join stream. Shared by the reactor and the job table,
// so deliveries never touch a reactor that is gone.
struct Sink {
  std::mutex mu;
  JoinReactor* reactor = nullptr;  // null once the reactor is done
};

class RendezvousServer::Impl {
 public:
  explicit Impl(const ServerOptions& opts) : opts_(opts), clock_(*opts.clock) {}
  ~Impl() { Shutdown(); }

  absl::Status Start();
  void Shutdown();
  void Wait() {
    std::unique_lock<std::mutex> lock(shutdown_mu_);
    shutdown_cv_.wait(lock, [&] { return shutting_down_; });
  }
  int port() const { return port_; }

  // ---- Rendezvous service, called by the adapter.
  absl::StatusOr<std::string> Join(const JoinSpec& spec, std::shared_ptr<Sink> sink);
  absl::Status Report(const std::string& job_id, const std::string& node_id, std::int64_t round,
                      Outcome outcome, std::vector<WorkerFailure> failures);
  // The stream of node broke (client gone). Ignored unless sink is current.
  void StreamLost(const std::string& job_id, const std::string& node_id, const Sink* sink);
  void Unregister(const std::string& job_id, const std::string& node_id, const Sink* sink);
  std::vector<JobStatus> Status(const std::string& job_id) const;

  // ---- Store service: the engine for a scope, after checking token and round.
  absl::StatusOr<std::shared_ptr<KvEngine>> StoreFor(const pb::StoreScope& scope);
  // Makes a store write durable before it is acknowledged (no-op in memory).
  absl::Status PersistKey(const pb::StoreScope& scope, const std::string& key,
                          const KvEngine& engine) {
    if (!state_) return absl::OkStatus();
    return state_->AppendKey(scope.job_id(), scope.round(), key, engine);
  }
  TimePoint Now() const { return clock_.Now(); }

 private:
  struct Job {
    std::unique_ptr<JobRendezvous> rdzv;
    std::shared_ptr<KvEngine> store;
    std::int64_t store_round = 0;
    std::map<std::string, std::shared_ptr<Sink>> sinks;
    std::optional<TimePoint> closed_at;
    std::uint64_t persisted_version = 0;
  };
  using Batch = std::vector<std::pair<std::shared_ptr<Sink>, RoundEvent>>;

  // Turns deliveries into (sink, event) pairs; terminal events unregister the sink.
  void CollectLocked(Job& job, std::vector<Delivery>& out, Batch* batch);
  static void Send(Batch& batch);
  void RotateStoreLocked(Job& job);
  void PersistLocked(Job& job);
  absl::Status RecoverLocked();
  void TickLoop();

  ServerOptions opts_;
  const Clock& clock_;
  int port_ = 0;
  std::unique_ptr<StateLog> state_;

  mutable std::mutex mu_;
  bool closing_ = false;  // Shutdown() began: refuse changes
  std::map<std::string, Job> jobs_;

  // Services outlive the server that calls them (members die in reverse order).
  std::unique_ptr<grpc::Service> rdzv_service_;
  std::unique_ptr<grpc::Service> store_service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread ticker_;
  std::atomic<bool> stop_{false};

  std::mutex shutdown_mu_;
  std::condition_variable shutdown_cv_;
  bool shutting_down_ = false;
};

// One Join call: writes queued RoundEvents in order; a terminal event (restart,
// closed, error) ends the stream.
class JoinReactor final : public grpc::ServerWriteReactor<pb::RoundEvent> {
 public:
  JoinReactor(RendezvousServer::Impl* impl) : impl_(impl), sink_(std::make_shared<Sink>()) {
    sink_->reactor = this;
  }

  std::shared_ptr<Sink> sink() const { return sink_; }
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

  void FailNow(const absl::Status& st) {
    std::lock_guard<std::mutex> lock(sink_->mu);
    PushLocked(st);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(sink_->mu);
    writing_ = false;
    if (!ok) {  // the client went away; OnCancel reports the loss
      if (!finishing_) {
        finishing_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
      }
      return;
    }
    StartNextLocked();
  }

  void OnCancel() override {
    std::string job, node;
    {
      std::lock_guard<std::mutex> lock(sink_->mu);
      // A cancelled call must still be finished, or OnDone never comes.
      if (!finishing_ && !writing_) {
        finishing_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled"));
      }
      if (terminal_queued_) return;  // the stream was ending anyway
      job = job_id_;
      node = node_id_;
    }
    if (!node.empty()) impl_->StreamLost(job, node, sink_.get());
  }

  void OnDone() override {
    std::string job, node;
    bool clean;
    {
      std::lock_guard<std::mutex> lock(sink_->mu);
      sink_->reactor = nullptr;
      job = job_id_;
      node = node_id_;
      clean = terminal_queued_;
    }
    // A stream that ends without a terminal event lost its agent (StreamLost
    // ignores a sink that is no longer current, so this is idempotent).
    if (!node.empty()) {
      if (clean) {
        impl_->Unregister(job, node, sink_.get());
      } else {
        impl_->StreamLost(job, node, sink_.get());
      }
    }
    delete this;
  }

 private:
  void StartNextLocked() {
    if (finishing_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
      return;
    }
    if (terminal_queued_) {
      finishing_ = true;
      Finish(final_status_);
    }
  }

  RendezvousServer::Impl* impl_;
  std::shared_ptr<Sink> sink_;
  std::string job_id_, node_id_;
  std::deque<pb::RoundEvent> queue_;
  pb::RoundEvent current_;
  bool writing_ = false;
  bool terminal_queued_ = false;
  bool finishing_ = false;
  grpc::Status final_status_ = grpc::Status::OK;
};

// ------------------------------------------------------------ Services

namespace {

class RendezvousServiceImpl final : public pb::Rendezvous::CallbackService {
 public:
  explicit RendezvousServiceImpl(RendezvousServer::Impl* impl) : impl_(impl) {}

  grpc::ServerWriteReactor<pb::RoundEvent>* Join(grpc::CallbackServerContext* ctx,
                                                 const pb::JoinRequest* req) override {
    auto* reactor = new JoinReactor(impl_);
    JoinSpec spec = FromProto(*req);
    if (absl::Status st = ValidateJoin(spec); !st.ok()) {
      reactor->FailNow(st);
      return reactor;
    }
    auto node = impl_->Join(spec, reactor->sink());
    if (!node.ok()) reactor->FailNow(node.status());
    return reactor;
  }

  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* ctx,
                                   const pb::ReportRequest* req,
                                   pb::ReportResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    std::vector<WorkerFailure> failures;
    for (const auto& f : req->failures()) failures.push_back(FromProto(f));
    absl::Status st = ValidateJobId(req->job_id());
    if (st.ok()) {
      st = impl_->Report(req->job_id(), req->node_id(), req->round(), FromProto(req->outcome()),
                         std::move(failures));
    }
    reactor->Finish(ToGrpc(st));
    return reactor;
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const pb::StatusRequest* req,
                                   pb::StatusResponse* resp) override {
    for (const auto& s : impl_->Status(req->job_id())) ToProto(s, resp->add_jobs());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  RendezvousServer::Impl* impl_;
};

class StoreServiceImpl final : public pb::Store::CallbackService {
 public:
  explicit StoreServiceImpl(RendezvousServer::Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const pb::SetRequest* req,
                                pb::SetResponse*) override {
    return Run(ctx, req->scope(), [&](KvEngine& e) {
      DDPRUN_RETURN_IF_ERROR(e.Set(req->key(), req->value()));
      return impl_->PersistKey(req->scope(), req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    return Run(ctx, req->scope(), [&](KvEngine& e) -> absl::Status {
      auto v = e.Add(req->key(), req->delta());
      if (!v.ok()) return v.status();
      resp->set_value(*v);
      return impl_->PersistKey(req->scope(), req->key(), e);
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const pb::CompareSetRequest* req,
                                       pb::CompareSetResponse* resp) override {
    return Run(ctx, req->scope(), [&](KvEngine& e) -> absl::Status {
      std::optional<std::string> expected;
      if (!req->expect_absent()) expected = req->expected();
      auto r = e.CompareSet(req->key(), expected, req->desired());
      if (!r.ok()) return r.status();
      resp->set_swapped(r->swapped);
      resp->set_current(r->current);
      return r->swapped ? impl_->PersistKey(req->scope(), req->key(), e) : absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const pb::DeleteRequest* req,
                                   pb::DeleteResponse* resp) override {
    return Run(ctx, req->scope(), [&](KvEngine& e) {
      resp->set_deleted(e.Delete(req->key()));
      return resp->deleted() ? impl_->PersistKey(req->scope(), req->key(), e) : absl::OkStatus();
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
    auto engine = impl_->StoreFor(scope);
    reactor->Finish(ToGrpc(engine.ok() ? op(**engine) : engine.status()));
    return reactor;
  }

  // Waits (without blocking a thread) for keys, then runs then(engine).
  template <typename F>
  grpc::ServerUnaryReactor* RunWait(grpc::CallbackServerContext* ctx,
                                    const pb::StoreScope& scope, std::vector<std::string> keys,
                                    double timeout_s, F then) {
    auto* reactor = ctx->DefaultReactor();
    auto engine = impl_->StoreFor(scope);
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
    e->WaitAsync(std::move(keys), impl_->Now() + ClampTimeout(timeout_s),
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

absl::Status RendezvousServer::Impl::Start() {
  SilenceGrpcLogging();
  if (!opts_.state_dir.empty()) {
    auto log = StateLog::Open(opts_.state_dir);
    if (!log.ok()) return log.status();
    state_ = std::move(*log);
    std::lock_guard<std::mutex> lock(mu_);
    DDPRUN_RETURN_IF_ERROR(RecoverLocked());
  }
  const int lease_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease_timeout).count());
  rdzv_service_ = std::make_unique<RendezvousServiceImpl>(this);
  store_service_ = std::make_unique<StoreServiceImpl>(this);
  grpc::ServerBuilder builder;
  const std::string addr = (opts_.host.find(':') != std::string::npos ? "[" + opts_.host + "]"
                                                                      : opts_.host) +
                           ":" + std::to_string(opts_.port);
  builder.AddListeningPort(addr, grpc::InsecureServerCredentials(), &port_);
  // gRPC sets SO_REUSEPORT by default, which would let two servers share a
  // port silently. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive pings detect a silent peer (cut network) within the lease.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, std::max(100, lease_ms / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(100, lease_ms / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(rdzv_service_.get());
  builder.RegisterService(store_service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
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
    return absl::UnavailableError("cannot listen on " + addr + ": " + why +
                                  "; pick another port or stop the process that holds it");
  }
  ticker_ = std::thread([this] { TickLoop(); });
  return absl::OkStatus();
}

void RendezvousServer::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  {
    // From now on nothing changes a job: streams that end because we stop
    // are not lost agents, and a restarted server must find the jobs as they
    // were (--state_dir).
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  shutdown_cv_.notify_all();
  stop_ = true;
  if (ticker_.joinable()) ticker_.join();
  // End every open stream and cancel store waits so Shutdown cannot hang.
  Batch batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, job] : jobs_) {
      for (auto& [node, sink] : job.sinks)
        batch.emplace_back(sink, absl::UnavailableError(Fence(id, job.rdzv->round()) +
                                                        "the rendezvous server is shutting down"));
      job.sinks.clear();
      if (job.store) job.store->CancelAll(absl::UnavailableError("the server is shutting down"));
    }
  }
  Send(batch);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

void RendezvousServer::Impl::CollectLocked(Job& job, std::vector<Delivery>& out, Batch* batch) {
  for (auto& d : out) {
    auto it = job.sinks.find(d.node_id);
    if (it == job.sinks.end()) continue;  // that agent is gone; nothing to tell
    const bool terminal = !std::holds_alternative<Assignment>(d.event);
    batch->emplace_back(it->second, std::move(d.event));
    if (terminal) job.sinks.erase(it);
  }
  if (job.rdzv->state() == JobRendezvous::State::kClosed && !job.closed_at) {
    job.closed_at = clock_.Now();
  }
  RotateStoreLocked(job);
  // Durable before anyone hears of it: deliveries are sent after this returns.
  PersistLocked(job);
}

void RendezvousServer::Impl::PersistLocked(Job& job) {
  if (!state_ || job.persisted_version == job.rdzv->version()) return;
  absl::Status st = state_->WriteSnapshot(job.rdzv->Snapshot(), job.store_round, *job.store);
  if (!st.ok()) {
    std::fprintf(stderr, "ddprund: %scannot persist the job: %s\n",
                 Fence(job.rdzv->job_id(), job.rdzv->round()).c_str(),
                 std::string(st.message()).c_str());
    return;  // retried on the next change
  }
  job.persisted_version = job.rdzv->version();
}

absl::Status RendezvousServer::Impl::RecoverLocked() {
  auto recovered = state_->Recover();
  if (!recovered.ok()) return recovered.status();
  for (auto& r : *recovered) {
    for (const auto& w : r.warnings) std::fprintf(stderr, "ddprund: warning: %s\n", w.c_str());
    Job job;
    job.rdzv = JobRendezvous::Restore(r.snapshot, clock_, opts_.reattach_timeout);
    job.store = std::make_shared<KvEngine>();
    job.store_round = r.store_round;
    for (auto& [k, v] : r.store) (void)job.store->Set(k, std::move(v));
    job.persisted_version = job.rdzv->version();
    if (job.rdzv->state() == JobRendezvous::State::kClosed) job.closed_at = clock_.Now();
    const std::string id = r.snapshot.job_id;
    jobs_.emplace(id, std::move(job));
  }
  return absl::OkStatus();
}

void RendezvousServer::Impl::Send(Batch& batch) {
  for (auto& [sink, event] : batch) {
    std::lock_guard<std::mutex> lock(sink->mu);
    if (sink->reactor) sink->reactor->PushLocked(std::move(event));
  }
}

void RendezvousServer::Impl::RotateStoreLocked(Job& job) {
  // Each round gets a fresh store, so no worker ever reads a stale key (for
  // example a previous round's ncclUniqueId). Waiters of the old round fail.
  if (job.store && job.store_round == job.rdzv->round()) return;
  if (job.store) {
    job.store->CancelAll(absl::FailedPreconditionError(
        Fence(job.rdzv->job_id(), job.store_round) + "the round is over; the worker must exit"));
  }
  job.store = std::make_shared<KvEngine>();
  job.store_round = job.rdzv->round();
}

absl::StatusOr<std::string> RendezvousServer::Impl::Join(const JoinSpec& spec,
                                                         std::shared_ptr<Sink> sink) {
  Batch batch;
  std::string node;
  absl::Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return absl::UnavailableError("the rendezvous server is shutting down");
    auto it = jobs_.find(spec.job_id);
    const bool created = it == jobs_.end();
    if (created) {
      if (jobs_.size() >= kMaxJobs)
        return absl::ResourceExhaustedError("the rendezvous server holds too many jobs");
      Job job;
      job.rdzv = std::make_unique<JobRendezvous>(spec.job_id, clock_, opts_.quarantine);
      it = jobs_.emplace(spec.job_id, std::move(job)).first;
    }
    Job& job = it->second;
    std::vector<Delivery> out;
    auto id = job.rdzv->Join(spec, &out);
    if (!id.ok()) {
      refused = id.status();
      if (created) {
        jobs_.erase(it);  // a refused first join leaves no empty job behind
      } else {
        // A refused join can still change the job (a quarantined node that
        // the others were waiting for completes their round): tell them.
        CollectLocked(job, out, &batch);
      }
    } else {
      node = *id;
      {
        std::lock_guard<std::mutex> sl(sink->mu);
        if (sink->reactor) sink->reactor->SetNodeLocked(spec.job_id, node);
      }
      // Registered before delivering, so an assignment completed by this very
      // join reaches its own stream.
      job.sinks[node] = sink;
      CollectLocked(job, out, &batch);
    }
  }
  Send(batch);
  if (!refused.ok()) return refused;
  return node;
}

absl::Status RendezvousServer::Impl::Report(const std::string& job_id, const std::string& node_id,
                                            std::int64_t round, Outcome outcome,
                                            std::vector<WorkerFailure> failures) {
  Batch batch;
  absl::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return absl::UnavailableError("the rendezvous server is shutting down");
    auto it = jobs_.find(job_id);
    if (it == jobs_.end())
      return absl::NotFoundError(Fence(job_id, round) + "no such job on this server");
    std::vector<Delivery> out;
    st = it->second.rdzv->Report(node_id, round, outcome, std::move(failures), &out);
    CollectLocked(it->second, out, &batch);
  }
  Send(batch);
  return st;
}

void RendezvousServer::Impl::StreamLost(const std::string& job_id, const std::string& node_id,
                                        const Sink* sink) {
  Batch batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    auto s = it->second.sinks.find(node_id);
    if (s == it->second.sinks.end() || s->second.get() != sink) return;  // a stale stream
    it->second.sinks.erase(s);
    std::vector<Delivery> out;
    it->second.rdzv->NodeLost(node_id, &out);
    CollectLocked(it->second, out, &batch);
  }
  Send(batch);
}

void RendezvousServer::Impl::Unregister(const std::string& job_id, const std::string& node_id,
                                        const Sink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  auto s = it->second.sinks.find(node_id);
  if (s != it->second.sinks.end() && s->second.get() == sink) it->second.sinks.erase(s);
}

std::vector<JobStatus> RendezvousServer::Impl::Status(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobStatus> result;
  for (const auto& [id, job] : jobs_) {
    if (job_id.empty() || job_id == id) result.push_back(job.rdzv->Status());
  }
  return result;
}

absl::StatusOr<std::shared_ptr<KvEngine>> RendezvousServer::Impl::StoreFor(
    const pb::StoreScope& scope) {
  DDPRUN_RETURN_IF_ERROR(ValidateJobId(scope.job_id()));
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return absl::UnavailableError("the rendezvous server is shutting down");
  auto it = jobs_.find(scope.job_id());
  // The same answer for an unknown job and a wrong token: a stranger learns nothing.
  if (scope.token().empty())
    return absl::UnauthenticatedError(Fence(scope.job_id(), scope.round()) +
                                      "store request without a token; run the worker under "
                                      "ddprun, which sets DDPRUN_TOKEN");
  if (it == jobs_.end() || it->second.rdzv->store_token() != scope.token())
    return absl::PermissionDeniedError(Fence(scope.job_id(), scope.round()) +
                                       "the store token does not match this job; use the "
                                       "DDPRUN_TOKEN that ddprun gave this job's workers");
  Job& job = it->second;
  if (scope.round() != job.rdzv->round())
    return absl::FailedPreconditionError(Fence(scope.job_id(), scope.round()) +
                                         "stale round: the job is in round " +
                                         std::to_string(job.rdzv->round()) +
                                         "; a worker of an old round must exit");
  RotateStoreLocked(job);
  return job.store;
}

void RendezvousServer::Impl::TickLoop() {
  while (!stop_) {
    std::this_thread::sleep_for(opts_.tick_interval);
    Batch batch;
    std::vector<std::shared_ptr<KvEngine>> engines;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) break;
      const TimePoint now = clock_.Now();
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        Job& job = it->second;
        if (job.closed_at && now - *job.closed_at > kClosedJobRetention && job.sinks.empty()) {
          if (state_) state_->Forget(it->first);
          it = jobs_.erase(it);
          continue;
        }
        auto next = job.rdzv->NextDeadline();
        if (next && *next <= now) {
          std::vector<Delivery> out;
          job.rdzv->Tick(&out);
          CollectLocked(job, out, &batch);
        }
        if (job.store && job.store->NumWaiters() > 0) engines.push_back(job.store);
        ++it;
      }
    }
    Send(batch);
    const TimePoint now = clock_.Now();
    for (auto& e : engines) e->ExpireWaiters(now);
  }
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
void RendezvousServer::Shutdown() { impl_->Shutdown(); }
void RendezvousServer::Wait() { impl_->Wait(); }
std::vector<JobStatus> RendezvousServer::Status() const { return impl_->Status(""); }

}  // namespace ddprun::rendezvous
