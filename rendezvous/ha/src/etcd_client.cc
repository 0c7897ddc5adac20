// EtcdClient over etcd's v3 gRPC API (etcd_client.h). Unary calls use the
// synchronous API with a deadline per member; the lease keeper and each watch
// own one thread.
#include "ddprun/rendezvous/ha/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/rendezvous/tls_credentials.h"
#include "ddprun/rendezvous/tls_probe.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace ddprun::rendezvous {
namespace {

namespace epb = ::etcdserverpb;
using std::chrono::milliseconds;

// Replies of a Range over many keys (recovery of every job) exceed gRPC's 4 MiB.
constexpr int kMaxReceiveBytes = 256 << 20;
// How long a call waits for a member whose connection is failing.
constexpr auto kFailingMemberWait = std::chrono::milliseconds(500);

std::chrono::system_clock::time_point DeadlineAfter(Duration d) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
}

// Codes after which another member may answer: unreachable, no quorum
// ("etcdserver: no leader", "request timed out" are UNAVAILABLE), too slow.
bool TryNextMember(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

EtcdKeyValue FromPb(const ::mvccpb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                      kv.mod_revision(), kv.version(), kv.lease()};
}

EtcdRange FromPb(const epb::RangeResponse& r) {
  EtcdRange out;
  out.count = r.count();
  out.revision = r.header().revision();
  for (const auto& kv : r.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

void ToPb(const EtcdOp& op, epb::RequestOp* out) {
  switch (op.kind) {
    case EtcdOp::Kind::kRange: {
      auto* r = out->mutable_request_range();
      r->set_key(op.key);
      r->set_range_end(op.range_end);
      break;
    }
    case EtcdOp::Kind::kPut: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::kDelete: {
      auto* d = out->mutable_request_delete_range();
      d->set_key(op.key);
      d->set_range_end(op.range_end);
      break;
    }
  }
}

void ToPb(const EtcdCompare& c, epb::Compare* out) {
  out->set_key(c.key);
  out->set_range_end(c.range_end);
  switch (c.result) {
    case EtcdCompare::Result::kEqual:
      out->set_result(epb::Compare::EQUAL);
      break;
    case EtcdCompare::Result::kGreater:
      out->set_result(epb::Compare::GREATER);
      break;
    case EtcdCompare::Result::kLess:
      out->set_result(epb::Compare::LESS);
      break;
    case EtcdCompare::Result::kNotEqual:
      out->set_result(epb::Compare::NOT_EQUAL);
      break;
  }
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      out->set_target(epb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      out->set_target(epb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      out->set_target(epb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case EtcdCompare::Target::kValue:
      out->set_target(epb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case EtcdCompare::Target::kLease:
      out->set_target(epb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

}  // namespace

EtcdOp EtcdOp::Put(std::string key, std::string value, std::int64_t lease) {
  EtcdOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}
EtcdOp EtcdOp::Delete(std::string key, std::string range_end) {
  EtcdOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}
EtcdOp EtcdOp::Range(std::string key, std::string range_end) {
  EtcdOp op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// ------------------------------------------------------------------ Impl

class EtcdClient::Impl {
 public:
  struct Member {
    std::string name;  // "H:P"
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<epb::KV::Stub> kv;
    std::unique_ptr<epb::Lease::Stub> lease;
    std::unique_ptr<epb::Watch::Stub> watch;
  };

  explicit Impl(EtcdOptions options) : options_(std::move(options)) {}

  absl::Status Init() {
    if (options_.endpoints.empty()) {
      return absl::InvalidArgumentError("no etcd endpoint given; " + options_.fix);
    }
    DDPRUN_ASSIGN_OR_RETURN(tls_, LoadClientTls(options_.tls));
    const TlsConfig& tls = tls_;
    SilenceGrpcLogging();
    for (const HostPort& hp : options_.endpoints) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
      // A restarted member is found again within ~1 s, not gRPC's default of
      // up to two minutes of backoff.
      // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also uses it as the
      // connect timeout, and a member that is starting needs more than that.)
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
      // One connection per member per client: never share a subchannel with
      // another EtcdClient of this process (a test's two replicas).
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      Member m;
      m.name = FormatHostPort(hp);
      m.channel = grpc::CreateCustomChannel(m.name, MakeChannelCredentials(tls), args);
      m.kv = epb::KV::NewStub(m.channel);
      m.lease = epb::Lease::NewStub(m.channel);
      m.watch = epb::Watch::NewStub(m.channel);
      members_.push_back(std::move(m));
    }
    return absl::OkStatus();
  }

  std::size_t size() const { return members_.size(); }
  Member& member(std::size_t i) { return members_[i % members_.size()]; }
  std::size_t current() const { return current_.load(); }
  void Answered(std::size_t i) { current_.store(i % members_.size()); }
  const EtcdOptions& options() const { return options_; }
  const TlsConfig& tls() const { return tls_; }
  std::atomic<std::int64_t> writes{0};

  // Runs call(member, context) on each member in turn, from the one that
  // answered last, until one answers or all were tried.
  template <typename Call>
  absl::Status Each(Call call) {
    std::vector<std::string> why;
    const std::size_t start = current_.load();
    for (std::size_t k = 0; k < members_.size(); ++k) {
      const std::size_t i = (start + k) % members_.size();
      grpc::ClientContext ctx;
      // Wait for the connection within the deadline (a member that refused us
      // earlier is retried now, not after gRPC's backoff), but give a member
      // known to be failing only a short while before moving on.
      const bool failing = members_[i].channel->GetState(true) == GRPC_CHANNEL_TRANSIENT_FAILURE;
      ctx.set_deadline(
          DeadlineAfter(failing ? std::min<Duration>(options_.call_timeout, kFailingMemberWait)
                                : options_.call_timeout));
      ctx.set_wait_for_ready(true);
      grpc::Status s = call(members_[i], ctx);
      if (s.ok()) {
        current_.store(i);
        return absl::OkStatus();
      }
      if (!TryNextMember(s)) return Refused(members_[i].name, s);
      why.push_back(absl::StrCat(members_[i].name, ": ", Describe(s)));
      DDPRUN_DEBUG_LOG(kRdzv) << "etcd at " << members_[i].name << ": " << Describe(s);
    }
    return Unreachable(why);
  }

  absl::Status Unreachable(const std::vector<std::string>& why) const {
    return absl::UnavailableError(
        absl::StrCat("etcd unreachable (", absl::StrJoin(why, "; "), "); ", options_.fix));
  }

  static std::string Describe(const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return "no answer in time";
    std::string m = s.error_message();
    return m.empty() ? "code " + std::to_string(s.error_code()) : m;
  }

  static absl::Status Refused(const std::string& name, const grpc::Status& s) {
    return absl::Status(
        static_cast<absl::StatusCode>(s.error_code()),
        absl::StrCat("etcd at ", name, " refused the request: ", s.error_message()));
  }

 private:
  EtcdOptions options_;
  TlsConfig tls_;
  std::vector<Member> members_;
  std::atomic<std::size_t> current_{0};
};

namespace {

// ----------------------------------------------------------- lease keeper

class LeaseKeeper final : public EtcdLeaseKeeper {
 public:
  LeaseKeeper(EtcdClient::Impl* impl, EtcdLease lease, std::function<void(absl::Status)> on_lost)
      : impl_(impl), lease_(lease), on_lost_(std::move(on_lost)) {
    valid_until_ = std::chrono::steady_clock::now() + std::chrono::seconds(lease.ttl_s);
    thread_ = std::thread([this] { Run(); });
  }
  ~LeaseKeeper() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
    thread_.join();
  }
  bool Alive() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return !lost_ && std::chrono::steady_clock::now() < valid_until_;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void Run() {
    const auto period = std::chrono::milliseconds(lease_.ttl_s * 1000 / 3);
    Clock::time_point next = Clock::now() + period;
    std::size_t member = impl_->current();
    std::string last_error = "no renewal yet";
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_until(lock, std::min(next, valid_until_), [&] { return stop_; });
        if (stop_) return;
        if (Clock::now() >= valid_until_) {
          lost_ = true;
          lock.unlock();
          on_lost_(absl::UnavailableError(
              absl::StrCat("the etcd lease ", lease_.id, " was not renewed within its TTL of ",
                           lease_.ttl_s, " s (", last_error, "); ", impl_->options().fix)));
          return;
        }
      }
      const Clock::time_point sent = Clock::now();
      auto& m = impl_->member(member);
      auto ctx = std::make_unique<grpc::ClientContext>();
      ctx->set_deadline(DeadlineAfter(
          std::min<Duration>(impl_->options().call_timeout, valid_until_ - Clock::now())));
      ctx->set_wait_for_ready(true);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        ctx_ = ctx.get();
      }
      epb::LeaseKeepAliveRequest req;
      req.set_id(lease_.id);
      epb::LeaseKeepAliveResponse resp;
      auto stream = m.lease->LeaseKeepAlive(ctx.get());
      bool got = stream->Write(req) && stream->Read(&resp);
      stream->WritesDone();
      grpc::Status s = stream->Finish();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ctx_ = nullptr;
        if (stop_) return;
      }
      if (got) {
        if (resp.ttl() <= 0) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            lost_ = true;
          }
          on_lost_(absl::UnavailableError(
              absl::StrCat("etcd says the lease ", lease_.id, " has expired")));
          return;
        }
        impl_->Answered(member);
        std::lock_guard<std::mutex> lock(mu_);
        valid_until_ = sent + std::chrono::seconds(resp.ttl());
        next = Clock::now() + period;
      } else {
        last_error =
            absl::StrCat(m.name, ": ", s.ok() ? "stream closed" : EtcdClient::Impl::Describe(s));
        DDPRUN_DEBUG_LOG(kRdzv) << "etcd lease keep-alive: " << last_error;
        ++member;  // the next member, soon
        next = Clock::now() + milliseconds(100);
      }
    }
  }

  EtcdClient::Impl* impl_;
  const EtcdLease lease_;
  std::function<void(absl::Status)> on_lost_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool lost_ = false;
  Clock::time_point valid_until_;
  grpc::ClientContext* ctx_ = nullptr;  // the renewal in flight
  std::thread thread_;
};

// ------------------------------------------------------------------ watch

class Watcher final : public EtcdWatch {
 public:
  Watcher(EtcdClient::Impl* impl, std::string key, std::string range_end, std::int64_t start,
          std::function<void(const std::vector<EtcdEvent>&)> on_events,
          std::function<void(absl::Status)> on_error)
      : impl_(impl),
        key_(std::move(key)),
        range_end_(std::move(range_end)),
        next_revision_(start),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Run() {
    std::size_t member = impl_->current();
    while (true) {
      auto& m = impl_->member(member);
      auto ctx = std::make_unique<grpc::ClientContext>();
      // etcd ends the watch when its member loses the quorum, so that we move
      // on to a member that has one.
      ctx->AddMetadata("hasleader", "true");
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        ctx_ = ctx.get();
      }
      auto stream = m.watch->Watch(ctx.get());
      epb::WatchRequest req;
      auto* create = req.mutable_create_request();
      create->set_key(key_);
      create->set_range_end(range_end_);
      create->set_start_revision(next_revision_);
      epb::WatchResponse resp;
      bool failed = false;
      if (stream->Write(req)) {
        while (stream->Read(&resp)) {
          if (resp.compact_revision() > 0 || (resp.canceled() && !resp.created())) {
            on_error_(absl::DataLossError(absl::StrCat("etcd compacted revision ", next_revision_,
                                                       " before this replica read it")));
            failed = true;
            break;
          }
          if (resp.canceled()) break;  // the member lost its leader: another one
          if (resp.events().empty()) continue;
          std::vector<EtcdEvent> events;
          for (const auto& e : resp.events()) {
            events.push_back(EtcdEvent{e.type() == ::mvccpb::Event::DELETE, FromPb(e.kv())});
            next_revision_ = std::max(next_revision_, e.kv().mod_revision() + 1);
          }
          impl_->Answered(member);
          on_events_(events);
        }
      }
      ctx->TryCancel();
      stream->Finish();
      {
        std::unique_lock<std::mutex> lock(mu_);
        ctx_ = nullptr;
        if (stop_ || failed) return;
        cv_.wait_for(lock, milliseconds(100), [&] { return stop_; });
        if (stop_) return;
      }
      ++member;
    }
  }

  EtcdClient::Impl* impl_;
  const std::string key_;
  const std::string range_end_;
  std::int64_t next_revision_;
  std::function<void(const std::vector<EtcdEvent>&)> on_events_;
  std::function<void(absl::Status)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  grpc::ClientContext* ctx_ = nullptr;
  std::thread thread_;
};

}  // namespace

// ---------------------------------------------------------------- facade

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  DDPRUN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

// The probe's finding in etcd's words: etcd's own flags for its side, this
// client's (names) for ours.
absl::Status EtcdClient::DiagnoseTls(Duration timeout) const {
  const TlsSourceNames& n = impl_->options().tls.names;
  for (const HostPort& hp : impl_->options().endpoints) {
    const TlsFinding found = ProbeTls(hp.host, hp.port, impl_->tls(), timeout);
    const std::string target = "etcd at " + FormatHostPort(hp);
    switch (found.problem) {
      case TlsProblem::kNone:
        continue;
      case TlsProblem::kServerNotTls:
        return TlsHandshakeError(target, "etcd does not speak TLS and this ddprund asks for it",
                                 absl::StrCat("drop ", n.ca, " (and ", n.cert, "/", n.key,
                                              "), or serve etcd with --cert-file and --key-file"));
      case TlsProblem::kServerRequiresTls:
        return TlsHandshakeError(
            target, "etcd requires TLS and this ddprund connects in plaintext",
            absl::StrCat("give ", n.ca, " with the CA that signed etcd's --cert-file (and ", n.cert,
                         "/", n.key, " if etcd runs with --client-cert-auth)"));
      case TlsProblem::kWrongName:
        return TlsHandshakeError(
            target, absl::StrCat("etcd's certificate is not issued for ", hp.host),
            "list etcd in --etcd_endpoints by a name or address in its certificate's "
            "subjectAltName, or issue it with this one");
      case TlsProblem::kUntrusted:
        return TlsHandshakeError(
            target, absl::StrCat("etcd's certificate is not trusted (", found.detail, ")"),
            absl::StrCat("check ", n.ca, ": it must be the CA that signed etcd's --cert-file"));
      case TlsProblem::kClientCertMissing:
        return TlsHandshakeError(
            target,
            "etcd requires a client certificate (mutual TLS, its --client-cert-auth) and this "
            "ddprund has none",
            absl::StrCat("give ", n.cert, " and ", n.key,
                         ", a certificate signed by the CA of etcd's --trusted-ca-file"));
      case TlsProblem::kClientCertRefused:
        return TlsHandshakeError(
            target,
            absl::StrCat("etcd refused this ddprund's client certificate (mutual TLS",
                         found.detail.empty() ? "" : ": " + found.detail, ")"),
            absl::StrCat("check ", n.cert,
                         ": it must be signed by the CA of etcd's "
                         "--trusted-ca-file"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EtcdRange> EtcdClient::Range(const std::string& key, const std::string& range_end,
                                            std::int64_t limit) {
  epb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  req.set_limit(limit);
  epb::RangeResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Each(
      [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Range(&ctx, req, &resp); }));
  return FromPb(resp);
}

absl::StatusOr<std::int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                             std::int64_t lease) {
  epb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  epb::PutResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Each([&](Impl::Member& m, grpc::ClientContext& ctx) {
    ++impl_->writes;
    return m.kv->Put(&ctx, req, &resp);
  }));
  return resp.header().revision();
}

absl::StatusOr<std::int64_t> EtcdClient::DeleteRange(const std::string& key,
                                                     const std::string& range_end) {
  epb::DeleteRangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  epb::DeleteRangeResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Each([&](Impl::Member& m, grpc::ClientContext& ctx) {
    ++impl_->writes;
    return m.kv->DeleteRange(&ctx, req, &resp);
  }));
  return resp.deleted();
}

absl::StatusOr<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                                              const std::vector<EtcdOp>& success,
                                              const std::vector<EtcdOp>& failure) {
  epb::TxnRequest req;
  for (const auto& c : compares) ToPb(c, req.add_compare());
  for (const auto& op : success) ToPb(op, req.add_success());
  for (const auto& op : failure) ToPb(op, req.add_failure());
  epb::TxnResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Each([&](Impl::Member& m, grpc::ClientContext& ctx) {
    ++impl_->writes;
    return m.kv->Txn(&ctx, req, &resp);
  }));
  EtcdTxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const auto& r : resp.responses()) {
    if (r.has_response_range()) out.ranges.push_back(FromPb(r.response_range()));
  }
  return out;
}

absl::StatusOr<EtcdLease> EtcdClient::LeaseGrant(std::int64_t ttl_s) {
  epb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  epb::LeaseGrantResponse resp;
  DDPRUN_RETURN_IF_ERROR(impl_->Each([&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.lease->LeaseGrant(&ctx, req, &resp);
  }));
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd refused a lease: ", resp.error()));
  }
  return EtcdLease{resp.id(), resp.ttl()};
}

absl::Status EtcdClient::LeaseRevoke(std::int64_t id) {
  epb::LeaseRevokeRequest req;
  req.set_id(id);
  epb::LeaseRevokeResponse resp;
  return impl_->Each([&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.lease->LeaseRevoke(&ctx, req, &resp);
  });
}

std::unique_ptr<EtcdLeaseKeeper> EtcdClient::KeepAlive(EtcdLease lease,
                                                       std::function<void(absl::Status)> on_lost) {
  return std::make_unique<LeaseKeeper>(impl_.get(), lease, std::move(on_lost));
}

std::unique_ptr<EtcdWatch> EtcdClient::Watch(
    const std::string& key, const std::string& range_end, std::int64_t start_revision,
    std::function<void(const std::vector<EtcdEvent>&)> on_events,
    std::function<void(absl::Status)> on_error) {
  return std::make_unique<Watcher>(impl_.get(), key, range_end, start_revision,
                                   std::move(on_events), std::move(on_error));
}

std::string EtcdClient::endpoint() const { return impl_->member(impl_->current()).name; }
std::int64_t EtcdClient::writes() const { return impl_->writes.load(); }

}  // namespace ddprun::rendezvous
