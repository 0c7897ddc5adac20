#include "ddprun/rendezvous/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/rendezvous/tls_credentials.h"
#include "ddprun/rendezvous/tls_probe.h"
#include "ddprun/v1/ddprun.grpc.pb.h"
#include "tcp_user_timeout.h"

namespace ddprun::rendezvous {
namespace {

// Extra time a waiting store call allows the server to answer by itself.
constexpr Duration kWaitSlack = std::chrono::seconds(5);
constexpr Duration kDefaultCallTimeout = std::chrono::seconds(30);
// WaitForConnected looks for a refused TLS handshake after this long.
constexpr Duration kFirstConnectSlice = std::chrono::milliseconds(500);

std::chrono::system_clock::time_point DeadlineAfter(Duration d) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
}

// gRPC keepalive: a ping after `time` without one, `timeout` for its answer.
// It is how a client notices a peer gone silent (a host lost, a network cut:
// no FIN, no RST) even on an idle stream. gRPC pings only connections with an
// open call, and (gRPC 1.51, chttp2's maybe_initiate_ping) never more than
// once a second whatever `time` says: a silent peer is found 0.5-1.5 s after
// it went silent with a timeout of 500 ms.
//
// `link_ms`, when set, separates the two things a late answer can mean
// (tcp_user_timeout.h). The ping's bytes unacknowledged by the peer's kernel
// for `link_ms`: the host or the link is gone, and the connection fails then.
// Acknowledged but not answered: the peer process is busy, and it has
// `timeout` to answer. Unset, gRPC uses `timeout` for both.
struct Keepalive {
  int time_ms;
  int timeout_ms;
  int link_ms = 0;
};
// An agent's channel when it lists replicas (SilenceTimeout::kFailover): its
// Join stream is how it learns that its replica is gone, so the answer is due
// within 500 ms, under the replicas' lease (docs/ha.md, "Choosing the lease
// TTL": what it costs, and a leader too busy to answer in time). ddprund
// allows pings every 500 ms.
constexpr Keepalive kFailoverKeepalive{1000, 500};
// Every other channel: agents of one ddprund or of an agent-hosted rendezvous,
// `ddprun status`, workers' store calls (GrpcStore, whose calls have deadlines
// and move on to the next replica by themselves). A lost host or a cut link
// is noticed as before, 1-2 s after it went silent (`link_ms`). A daemon
// that is alive but slow to answer the ping (10,000 strangers connecting to
// it on a loaded machine, docs/security.md) gets 20 s, gRPC's default: with
// one rendezvous there is nowhere else to go, and an agent that dropped its
// stream would be counted as a lost node (docs/ha.md, "The agents'
// keepalive").
constexpr Keepalive kPatientKeepalive{1000, 20000, 1000};

// Whether a channel keeps gRPC's retry filter. It retries nothing of ours on
// its own (no retry policy), but transparently re-sends a call that a
// connection refused before the server saw it, and it costs every call a
// filter and a buffered copy of what it sends: 12 % of the CPU of the
// simulated agents of a 16384-node round (docs/benchmarks.md, "Rendezvous,
// eighth session"). The store's channels keep it (Add and CompareSet are not
// repeated by GrpcStore itself); the rendezvous client's drops it: its Join
// stream is re-joined by the agent when it breaks, and its Report is best
// effort.
enum class Retries { kTransparent, kOff };

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const TlsConfig& tls,
                                           Keepalive keepalive, Retries retries) {
  SilenceGrpcLogging();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive.time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive.timeout_ms);
  if (keepalive.link_ms > 0) SetTcpUserTimeout(args, keepalive.link_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // No bandwidth-delay-product probing: gRPC would send a PING whenever data
  // arrives (and answer the peer's) to size its flow-control windows for bulk
  // transfers. Our messages are small (an Assignment, a store value), so the
  // windows stay at HTTP/2's 64 KiB, and a 16k-node round is not 16k more
  // ping/ack pairs on the daemon (docs/benchmarks.md, "Rendezvous, fifth
  // session"). A store value larger than 64 KiB takes a window update per
  // 64 KiB instead.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (retries == Retries::kOff) args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Reconnect quickly when a server comes up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Each client gets its own connection (agents and workers in one process
  // must not share a subchannel whose failure would take both down).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, MakeChannelCredentials(tls), args);
}

// Waits up to `timeout` for the channel to connect. A server that is there
// but refuses the handshake is named after the first slice, not at the end of
// a long wait, and once more at the end. Ok: connected; TlsHandshakeError;
// or DeadlineExceeded: not connected, and no TLS problem found.
absl::Status WaitOrDiagnose(grpc::Channel& channel, const std::string& host, int port,
                            const TlsConfig& tls, Duration timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  const Duration first = std::min<Duration>(timeout, kFirstConnectSlice);
  if (channel.WaitForConnected(DeadlineAfter(first))) return absl::OkStatus();
  DDPRUN_RETURN_IF_ERROR(DiagnoseTls(host, port, tls, first));
  if (std::chrono::steady_clock::now() < end) {
    if (channel.WaitForConnected(DeadlineAfter(end - std::chrono::steady_clock::now()))) {
      return absl::OkStatus();
    }
    DDPRUN_RETURN_IF_ERROR(DiagnoseTls(host, port, tls, first));
  }
  return absl::DeadlineExceededError("not connected");
}

}  // namespace

// ------------------------------------------------------------- JoinStream

namespace {

// Reads the server stream with gRPC's callback API (no thread per stream);
// events wait in a queue so Next() can have a timeout.
class GrpcJoinStream final : public JoinStream,
                             public grpc::ClientReadReactor<pb::RoundEvent> {
 public:
  GrpcJoinStream(pb::Rendezvous::Stub* stub, const JoinSpec& spec, std::string target)
      : request_(ToProto(spec)), target_(std::move(target)) {
    stub->async()->Join(&ctx_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }

  ~GrpcJoinStream() override {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    // OnDone follows a cancel promptly; the bound only guards against a bug.
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; });
  }

  RoundEvent Next(Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) {
      return absl::DeadlineExceededError("no word from the rendezvous at " + target_ +
                                         " in time");
    }
    RoundEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  void Cancel() override { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone has the status
    Push(FromProto(msg_));
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& st) override {
    RoundEvent last;
    if (st.ok()) {
      last = absl::CancelledError("the rendezvous ended the stream");
    } else if (st.error_code() == grpc::StatusCode::UNAVAILABLE && !SentByServer(st)) {
      // gRPC's own: the connection broke. (The server's Unavailable, when it
      // shuts down, says so itself.)
      last = absl::UnavailableError("lost the connection to the rendezvous at " + target_ + " (" +
                                    st.error_message() + ")");
    } else {
      last = FromGrpc(st);
    }
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(last));
    done_ = true;
    cv_.notify_all();
  }

 private:
  void Push(RoundEvent e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }

  grpc::ClientContext ctx_;
  pb::JoinRequest request_;
  pb::RoundEvent msg_;
  std::string target_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RoundEvent> events_;
  bool done_ = false;
};

}  // namespace

// ------------------------------------------------------- RendezvousClient

class RendezvousClient::Impl {
 public:
  Impl(const std::string& host, int port, const TlsConfig& tls, SilenceTimeout silence)
      : host_(host),
        port_(port),
        tls_(tls),
        target_(FormatHostPort(host, port)),
        channel_(MakeChannel(
            target_, tls,
            silence == SilenceTimeout::kFailover ? kFailoverKeepalive : kPatientKeepalive,
            Retries::kOff)),
        rdzv_(pb::Rendezvous::NewStub(channel_)) {}

  std::string host_;
  int port_;
  TlsConfig tls_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Rendezvous::Stub> rdzv_;
};

RendezvousClient::RendezvousClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousClient::~RendezvousClient() = default;

std::unique_ptr<RendezvousClient> RendezvousClient::Create(const std::string& host, int port,
                                                           const TlsConfig& tls,
                                                           SilenceTimeout silence) {
  return std::unique_ptr<RendezvousClient>(
      new RendezvousClient(std::make_unique<Impl>(host, port, tls, silence)));
}

const std::string& RendezvousClient::target() const { return impl_->target_; }

absl::Status RendezvousClient::WaitForConnected(Duration timeout) {
  const absl::Status st =
      WaitOrDiagnose(*impl_->channel_, impl_->host_, impl_->port_, impl_->tls_, timeout);
  if (st.ok() || IsTlsHandshakeError(st)) return st;
  return absl::UnavailableError("cannot reach the rendezvous at " + impl_->target_ + " within " +
                                std::to_string(std::chrono::duration<double>(timeout).count()) +
                                " s; check that ddprund runs there and the endpoint is right");
}

bool RendezvousClient::ConnectFailed() const {
  return impl_->channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE;
}

std::unique_ptr<JoinStream> RendezvousClient::Join(const JoinSpec& spec) {
  return std::make_unique<GrpcJoinStream>(impl_->rdzv_.get(), spec, impl_->target_);
}

absl::Status RendezvousClient::Report(const std::string& job_id, const std::string& node_id,
                                      std::int64_t round, Outcome outcome,
                                      const std::vector<WorkerFailure>& failures,
                                      Duration timeout) {
  pb::ReportRequest req;
  req.set_job_id(job_id);
  req.set_node_id(node_id);
  req.set_round(round);
  req.set_outcome(ToProto(outcome));
  for (const auto& f : failures) ToProto(f, req.add_failures());
  pb::ReportResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout));
  return FromGrpc(impl_->rdzv_->Report(&ctx, req, &resp));
}

absl::StatusOr<MetricsReply> RendezvousClient::ReportMetrics(const MetricsReport& report,
                                                             Duration timeout) {
  const pb::MetricsReport req = ToProto(report);
  pb::MetricsReply resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout));
  DDPRUN_RETURN_IF_ERROR(FromGrpc(impl_->rdzv_->ReportMetrics(&ctx, req, &resp)));
  return FromProto(resp);
}

absl::StatusOr<std::string> RendezvousClient::GetMetrics(const std::string& job_id,
                                                         Duration timeout) {
  pb::MetricsQuery req;
  req.set_job_id(job_id);
  pb::MetricsView resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout));
  DDPRUN_RETURN_IF_ERROR(FromGrpc(impl_->rdzv_->GetMetrics(&ctx, req, &resp)));
  return std::move(*resp.mutable_json());
}

absl::StatusOr<std::vector<JobStatus>> RendezvousClient::Status(const std::string& job_id,
                                                                Duration timeout) {
  pb::StatusRequest req;
  req.set_job_id(job_id);
  pb::StatusResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout));
  DDPRUN_RETURN_IF_ERROR(FromGrpc(impl_->rdzv_->Status(&ctx, req, &resp)));
  std::vector<JobStatus> out;
  for (const auto& j : resp.jobs()) out.push_back(FromProto(j));
  return out;
}

// --------------------------------------------------------------- GrpcStore

// With replicas (docs/ha.md), one call goes to the replica that answered last
// and moves on, in list order, while the store's deadline allows:
//   - a replica not connected within kReplicaSlice: nothing was sent;
//   - a replica that answers Unavailable itself (a standby, or one shutting
//     down): nothing was applied;
//   - a connection that broke during the call: it may have been applied, so
//     only calls that can be repeated safely (Set, Get, Wait, MultiGet,
//     Delete) go on; Add and CompareSet return the error.
// Standbys' replies name the leader in text only; the list order is the
// redirect (never a decision on text).
constexpr Duration kReplicaSlice = std::chrono::milliseconds(300);
// Between two rounds over every replica (no replica leads yet).
constexpr Duration kReplicaRoundPause = std::chrono::milliseconds(50);

class GrpcStore::Impl {
 public:
  struct Endpoint {
    std::string host;
    int port = 0;
    std::string target;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::Store::Stub> stub;
  };

  Impl(const std::vector<HostPort>& endpoints, StoreScope scope, const TlsConfig& tls)
      : tls_(tls), scope_(std::move(scope)) {
    for (const HostPort& hp : endpoints) {
      Endpoint e;
      e.host = hp.host;
      e.port = hp.port;
      e.target = FormatHostPort(hp.host, hp.port);
      e.channel = MakeChannel(e.target, tls, kPatientKeepalive, Retries::kTransparent);
      e.stub = pb::Store::NewStub(e.channel);
      eps_.push_back(std::move(e));
    }
  }

  void Fill(pb::StoreScope* s) const {
    s->set_job_id(scope_.job_id);
    s->set_token(scope_.token);
    s->set_round(scope_.round);
  }

  // Runs one call with a deadline; maps transport failures to a clear message.
  template <typename Req, typename Resp, typename Method>
  absl::Status Call(Method method, const Req& req, Resp* resp, Duration timeout,
                    bool repeatable = true) {
    if (eps_.size() > 1) return CallReplicas(method, req, resp, timeout, repeatable);
    Endpoint& ep = eps_[0];
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(timeout));
    ctx.set_wait_for_ready(true);
    grpc::Status st = ((*ep.stub).*method)(&ctx, req, resp);
    // Our own deadline, not the server's answer that a wait timed out.
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !SentByServer(st)) {
      // Never connected: a refused TLS handshake is the better answer.
      DDPRUN_RETURN_IF_ERROR(DiagnoseTls(ep.host, ep.port, tls_, kWaitSlack));
      return absl::DeadlineExceededError("the store at " + ep.target + " did not answer in time");
    }
    return FromGrpc(st);
  }

  template <typename Req, typename Resp, typename Method>
  absl::Status CallReplicas(Method method, const Req& req, Resp* resp, Duration timeout,
                            bool repeatable) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t i = current_.load();
    std::size_t tried = 0;
    std::string last;
    while (true) {
      const Duration left = deadline - std::chrono::steady_clock::now();
      if (left <= Duration::zero()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no replica of the store answered in time (last: ", last.empty() ? "none" : last, ")"));
      }
      if (tried > 0 && tried % eps_.size() == 0) {
        std::this_thread::sleep_for(std::min(left, kReplicaRoundPause));
      }
      Endpoint& ep = eps_[i];
      const std::size_t next = (i + 1) % eps_.size();
      ++tried;
      if (!ep.channel->WaitForConnected(DeadlineAfter(std::min(left, kReplicaSlice)))) {
        // A refused TLS handshake is not a replica to skip.
        DDPRUN_RETURN_IF_ERROR(DiagnoseTls(ep.host, ep.port, tls_, kReplicaSlice));
        last = ep.target + ": not connected";
        i = next;
        continue;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineAfter(deadline - std::chrono::steady_clock::now()));
      grpc::Status st = ((*ep.stub).*method)(&ctx, req, resp);
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
        const bool from_server = SentByServer(st);
        if (!from_server && !repeatable) {
          return absl::UnavailableError(
              absl::StrCat("lost the connection to the store at ", ep.target,
                           " during a call that is not repeated (it may have been applied): ",
                           st.error_message()));
        }
        DDPRUN_DEBUG_LOG(kStore) << "store replica " << ep.target << ": " << st.error_message()
                                 << "; trying the next one";
        last = absl::StrCat(ep.target, ": ", st.error_message());
        i = next;
        continue;
      }
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !SentByServer(st)) {
        return absl::DeadlineExceededError("the store at " + ep.target + " did not answer in time");
      }
      current_.store(i);
      return FromGrpc(st);
    }
  }

  TlsConfig tls_;
  std::vector<Endpoint> eps_;
  std::atomic<std::size_t> current_{0};
  StoreScope scope_;
};

GrpcStore::GrpcStore(const std::string& host, int port, StoreScope scope, const TlsConfig& tls)
    : impl_(std::make_unique<Impl>(std::vector<HostPort>{{host, port}}, std::move(scope), tls)) {}
GrpcStore::GrpcStore(const std::vector<HostPort>& replicas, StoreScope scope, const TlsConfig& tls)
    : impl_(std::make_unique<Impl>(replicas, std::move(scope), tls)) {}
GrpcStore::~GrpcStore() = default;

HostPort GrpcStore::endpoint() const {
  const Impl::Endpoint& ep = impl_->eps_[impl_->current_.load()];
  return HostPort{ep.host, ep.port};
}

absl::Status GrpcStore::CheckTls(Duration timeout) {
  if (impl_->eps_.size() == 1) {
    const Impl::Endpoint& ep = impl_->eps_[0];
    const absl::Status st = WaitOrDiagnose(*ep.channel, ep.host, ep.port, impl_->tls_, timeout);
    return IsTlsHandshakeError(st) ? st : absl::OkStatus();
  }
  // Replicas: done once one connects (a dead one is not waited for).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const Impl::Endpoint& ep : impl_->eps_) {
      const Duration left = deadline - std::chrono::steady_clock::now();
      if (left <= Duration::zero()) break;
      if (ep.channel->WaitForConnected(DeadlineAfter(std::min(left, kReplicaSlice)))) {
        return absl::OkStatus();
      }
      DDPRUN_RETURN_IF_ERROR(DiagnoseTls(ep.host, ep.port, impl_->tls_, kReplicaSlice));
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcStore::Set(const std::string& key, const std::string& value) {
  pb::SetRequest req;
  impl_->Fill(req.mutable_scope());
  req.set_key(key);
  req.set_value(value);
  pb::SetResponse resp;
  return impl_->Call(&pb::Store::Stub::Set, req, &resp, kDefaultCallTimeout);
}

absl::StatusOr<std::string> GrpcStore::Get(const std::string& key, Duration timeout) {
  pb::GetRequest req;
  impl_->Fill(req.mutable_scope());
  req.set_key(key);
  req.set_timeout_s(std::chrono::duration<double>(timeout).count());
  pb::GetResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Call(&pb::Store::Stub::Get, req, &resp, timeout + kWaitSlack));
  return std::move(*resp.mutable_value());
}

absl::StatusOr<std::int64_t> GrpcStore::Add(const std::string& key, std::int64_t delta) {
  pb::AddRequest req;
  impl_->Fill(req.mutable_scope());
  req.set_key(key);
  req.set_delta(delta);
  pb::AddResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Call(&pb::Store::Stub::Add, req, &resp, kDefaultCallTimeout,
                                     /*repeatable=*/false));
  return resp.value();
}

absl::StatusOr<bool> GrpcStore::CompareSet(const std::string& key,
                                           const std::optional<std::string>& expected,
                                           const std::string& desired, std::string* current) {
  pb::CompareSetRequest req;
  impl_->Fill(req.mutable_scope());
  req.set_key(key);
  if (expected) {
    req.set_expected(*expected);
  } else {
    req.set_expect_absent(true);
  }
  req.set_desired(desired);
  pb::CompareSetResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Call(&pb::Store::Stub::CompareSet, req, &resp, kDefaultCallTimeout,
                                     /*repeatable=*/false));
  if (current) *current = resp.current();
  return resp.swapped();
}

absl::Status GrpcStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  pb::WaitRequest req;
  impl_->Fill(req.mutable_scope());
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_s(std::chrono::duration<double>(timeout).count());
  pb::WaitResponse resp;
  return impl_->Call(&pb::Store::Stub::Wait, req, &resp, timeout + kWaitSlack);
}

absl::StatusOr<bool> GrpcStore::Delete(const std::string& key) {
  pb::DeleteRequest req;
  impl_->Fill(req.mutable_scope());
  req.set_key(key);
  pb::DeleteResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Call(&pb::Store::Stub::Delete, req, &resp, kDefaultCallTimeout));
  return resp.deleted();
}

absl::StatusOr<std::vector<std::string>> GrpcStore::MultiGet(const std::vector<std::string>& keys,
                                                             Duration timeout) {
  pb::MultiGetRequest req;
  impl_->Fill(req.mutable_scope());
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_s(std::chrono::duration<double>(timeout).count());
  pb::MultiGetResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Call(&pb::Store::Stub::MultiGet, req, &resp, timeout + kWaitSlack));
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

}  // namespace ddprun::rendezvous
