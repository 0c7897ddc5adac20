#include "ddprun/agent/checkpoint_replicas.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/background_priority.h"
#include "ddprun/agent/replica_channel.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::agent {
namespace {

namespace net = ::ddprun::rendezvous::net;
using replica::Header;
using replica::Op;

// Fetch receives and checksums a replica in pieces of this size (the
// socket buffer's: one piece is checked while the next one arrives).
constexpr std::uint64_t kFetchPiece = 4 << 20;

// Under --ckpt_bandwidth: bytes per send, each after its time at the rate.
constexpr std::size_t kPacedChunk = 4 << 20;

// Socket buffers of kSocketBuffer bytes each way: a replica is one long
// stream, and the defaults (~200 KiB on loopback) cost a wakeup per chunk.
constexpr int kSocketBuffer = 4 << 20;
void WideBuffers(int fd) {
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBuffer, sizeof kSocketBuffer);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBuffer, sizeof kSocketBuffer);
}

// The reply's status and message.
absl::Status ReadReply(replica::Channel& ch, ReplicaService::Clock::time_point deadline) {
  char fixed[replica::kReplyFixedBytes];
  if (absl::Status st = ch.Recv(fixed, sizeof fixed, deadline); !st.ok()) return st;
  bool ok = false;
  auto len = replica::ParseReplyFixed(std::string_view(fixed, sizeof fixed), &ok);
  if (!len.ok()) return absl::UnavailableError(len.status().message());
  std::string msg(*len, '\0');
  if (absl::Status st = ch.Recv(msg.data(), msg.size(), deadline); !st.ok()) return st;
  if (!ok) return absl::FailedPreconditionError(msg);
  return absl::OkStatus();
}

// The client's side of the handshake (checkpoint_replica_wire.h): proves
// the job's secret and checks the server's proof before anything else is
// sent, then (`encrypt`) encrypts the channel under keys from this
// connection's X25519 exchange. A refusal is FailedPrecondition with the
// server's line, as is a server that does not encrypt when this end does or
// the other way round; a server without the secret, or whose key proof does
// not hold (the exchange altered on the way), is PermissionDenied.
absl::Status ProveToServer(replica::Channel& ch, const std::string& endpoint,
                           const std::string& job_id, const std::string& token, bool encrypt,
                           ReplicaService::Clock::time_point deadline) {
  char challenge[replica::kChallengeBytes];
  if (absl::Status st = ch.Recv(challenge, sizeof challenge, deadline); !st.ok()) return st;
  bool server_encrypts = false;
  auto server_nonce =
      replica::ParseChallenge(std::string_view(challenge, sizeof challenge), &server_encrypts);
  if (!server_nonce.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(endpoint, " is ", server_nonce.status().message()));
  }
  replica::Transcript t;
  t.server_nonce = *server_nonce;
  t.client_nonce = replica::NewNonce();
  if (server_encrypts) {  // read whatever this end does, to answer in step
    t.server_public.resize(replica::kChallengeKeyBytes);
    if (absl::Status st = ch.Recv(t.server_public.data(), t.server_public.size(), deadline);
        !st.ok()) {
      return st;
    }
  }
  std::unique_ptr<replica::KeyExchange> kx;
  if (encrypt) {
    auto made = replica::KeyExchange::Create();
    if (!made.ok()) return absl::UnavailableError(made.status().message());
    kx = *std::move(made);
    t.client_public = kx->public_key();
  }
  std::string hello = replica::EncodeHello(
      t.client_nonce,
      replica::Proof("client", token, job_id, t.server_nonce, t.client_nonce, encrypt), encrypt);
  if (encrypt) hello += t.client_public + replica::KeyProof("client", token, job_id, t);
  if (absl::Status st = ch.Send(hello, deadline); !st.ok()) return st;
  // A server of the other setting refuses (its line names both), as does
  // one that saw other public keys than this end's proof covers.
  if (absl::Status st = ReadReply(ch, deadline); !st.ok()) return st;
  char proof[replica::kProofBytes];
  if (absl::Status st = ch.Recv(proof, sizeof proof, deadline); !st.ok()) return st;
  if (!replica::ProofHolds(
          replica::Proof("server", token, job_id, t.server_nonce, t.client_nonce, server_encrypts),
          std::string_view(proof, sizeof proof))) {
    return absl::PermissionDeniedError(
        absl::StrCat(endpoint, " did not prove this job's secret (not an agent of job ", job_id,
                     "); nothing was sent to it"));
  }
  if (server_encrypts != encrypt) {  // a server that did not refuse it itself
    return absl::FailedPreconditionError(encrypt
                                             ? replica::EncryptionMismatch(endpoint, "this node")
                                             : replica::EncryptionMismatch("this node", endpoint));
  }
  if (!encrypt) return absl::OkStatus();
  if (absl::Status st = ch.Recv(proof, sizeof proof, deadline); !st.ok()) return st;
  if (!replica::ProofHolds(replica::KeyProof("server", token, job_id, t),
                           std::string_view(proof, sizeof proof))) {
    return absl::PermissionDeniedError(replica::KeyExchangeAltered("this node", endpoint));
  }
  auto secret = kx->SharedSecret(t.server_public);
  if (!secret.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(endpoint, " sent ", secret.status().message(), "; nothing was sent to it"));
  }
  replica::ChannelKeys keys = replica::DeriveChannelKeys(token, job_id, *secret, t);
  const absl::Status st = ch.Encrypt(keys.client_to_server, keys.server_to_client);
  replica::Wipe(&*secret);
  replica::Wipe(&keys.client_to_server);
  replica::Wipe(&keys.server_to_client);
  return st;
}

// Connects to `endpoint` and proves the job's secret (ProveToServer).
absl::StatusOr<replica::Channel> Dial(const std::string& endpoint, const std::string& job_id,
                                      const std::string& token, bool encrypt,
                                      ReplicaService::Clock::time_point deadline) {
  // The library first: without it this end says so (its line names the fix)
  // and the peer sees no connection. Not a refusal: the sender tries again.
  if (absl::Status st = encrypt ? replica::LoadCipherLibrary() : absl::OkStatus(); !st.ok()) {
    return absl::UnavailableError(st.message());
  }
  auto hp = rendezvous::ParseHostPort(endpoint);
  if (!hp.ok()) return hp.status();
  auto addrs = net::ResolveTcp(hp->host, hp->port);
  if (!addrs.ok()) return addrs.status();
  absl::Status last = absl::UnavailableError("no address");
  for (const net::SocketAddress& a : *addrs) {
    auto fd = net::ConnectTcp(a, deadline);
    if (fd.ok()) {
      WideBuffers(fd->get());
      replica::Channel ch(*std::move(fd), endpoint);
      DDPRUN_RETURN_IF_ERROR(ProveToServer(ch, endpoint, job_id, token, encrypt, deadline));
      return ch;
    }
    last = fd.status();
  }
  return last;
}

std::string Ranks(const replica::Seat& s) {
  return s.local_ranks == 1
             ? absl::StrCat("rank ", s.base_rank)
             : absl::StrCat("ranks ", s.base_rank, "-", s.base_rank + s.local_ranks - 1);
}

}  // namespace

ReplicaService::ReplicaService(Options options, CheckpointMemory* memory, LogFn log)
    : options_(std::move(options)),
      memory_(memory),
      log_(std::move(log)),
      send_pace_(options_.bandwidth) {
  if (const char* ms = std::getenv(checkpoint_layout::kEnvTestReplicaDelayMs); ms != nullptr) {
    test_delay_ = std::chrono::milliseconds(std::strtol(ms, nullptr, 10));
  }
  if (const char* on = std::getenv(checkpoint_layout::kEnvTestReplicaCorruptOlder); on != nullptr) {
    test_corrupt_older_ = std::string_view(on) == "1";
  }
}

ReplicaService::~ReplicaService() { Stop(); }

absl::Status ReplicaService::Start() {
  auto fd = net::ListenTcp(options_.host, 0);
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrCat("--ckpt_replicas: cannot listen on ", options_.host,
                                               ": ", fd.status().message()));
  }
  endpoint_ = rendezvous::FormatHostPort(options_.host, net::LocalPort(fd->get()));
  listen_fd_ = fd->release();
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  if (memory_ != nullptr) send_thread_ = std::thread([this] { SendLoop(); });
  return absl::OkStatus();
}

void ReplicaService::Stop() {
  std::map<std::uint64_t, std::thread> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && conn_threads_.empty() && !accept_thread_.joinable()) return;
    stop_ = true;
    SetGatesLocked(false);
    send_pace_.Lift(true);  // a paced send stops waiting at its next chunk
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    cv_.notify_all();
  }
  if (wake_fd_ >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (send_thread_.joinable()) send_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(conn_threads_);
  }
  for (auto& [id, t] : conns) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void ReplicaService::SetRound(std::int64_t round, const std::string& token,
                              const std::string& successor) {
  std::lock_guard<std::mutex> lock(mu_);
  round_ = round;
  token_ = token;
  // Closed with nothing acknowledged until the sender, on its next poll,
  // restores what this successor acknowledged before (the same successor,
  // the same memory contents) or sends it the newest step.
  SetGatesLocked(!successor.empty());
  reassert_ = !successor.empty();
  successor_ = successor;
  cv_.notify_all();
}

void ReplicaService::ClearSuccessor() {
  std::lock_guard<std::mutex> lock(mu_);
  successor_.clear();
  SetGatesLocked(false);
}

void ReplicaService::SetGatesLocked(bool closed) {
  if (memory_ == nullptr) return;
  for (int j = 0; j < memory_->size(); ++j) memory_->SetReplicaGate(j, closed);
}

void ReplicaService::LogLimited(const std::string& msg) {
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    if (now - last_line_ < std::chrono::seconds(1)) {
      ++suppressed_;
      return;
    }
    last_line_ = now;
    line = msg;
    if (suppressed_ > 0)
      absl::StrAppend(&line, " (", suppressed_, " more refused in the last second)");
    suppressed_ = 0;
  }
  log_(line);
}

// ------------------------------------------------------------------ server

void ReplicaService::AcceptLoop() {
  const BackgroundThreads::Member member(options_.background, kAcceptThreadName);
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    std::string peer;
    net::UniqueFd conn = net::AcceptOne(listen_fd_, &peer);
    if (!conn.valid()) continue;
    std::vector<std::thread> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (std::uint64_t id : finished_) {
        finished.push_back(std::move(conn_threads_[id]));
        conn_threads_.erase(id);
      }
      finished_.clear();
    }
    for (std::thread& t : finished) t.join();  // each has returned already
    std::lock_guard<std::mutex> lock(mu_);
    if (active_ >= kMaxConnections) {
      // closed by conn's destructor
      continue;
    }
    ++active_;
    const int fd = conn.release();
    open_fds_.insert(fd);
    const std::uint64_t id = ++next_conn_;
    conn_threads_.emplace(id, std::thread([this, fd, peer, id] { Serve(fd, peer, id); }));
  }
}

void ReplicaService::Serve(int fd, std::string peer, std::uint64_t id) {
  const BackgroundThreads::Member member(options_.background, kReceiveThreadName);
  replica::Channel ch(net::UniqueFd(fd), peer);
  WideBuffers(fd);
  const auto deadline = Clock::now() + kIoTimeout;
  // A peer that connects and says nothing holds a slot kHeaderTimeout only.
  const auto header_deadline = Clock::now() + kHeaderTimeout;
  std::int64_t round = 0;
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
    token = token_;
  }
  const std::string fence = rendezvous::Fence(options_.job_id, round);
  auto refuse = [&](const std::string& why, bool reply) {
    if (reply) (void)ch.Send(replica::EncodeReply(false, why), deadline);
    LogLimited(absl::StrCat("--ckpt_replicas: dropped a connection from ", peer, ": ", why));
  };
  auto done = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.erase(fd);
    finished_.push_back(id);
    --active_;
  };
  // The handshake (checkpoint_replica_wire.h): nothing is read or held for
  // a peer that does not prove the job's secret.
  // Encrypting, this connection's X25519 key pair: without libcrypto the
  // challenge carries zeros and the client is refused below with the line
  // that names the fix (kx's status).
  replica::Transcript t;
  t.server_nonce = replica::NewNonce();
  const bool encrypt = options_.encrypt;
  absl::StatusOr<std::unique_ptr<replica::KeyExchange>> kx =
      encrypt ? replica::KeyExchange::Create()
              : absl::StatusOr<std::unique_ptr<replica::KeyExchange>>(nullptr);
  if (encrypt) {
    t.server_public =
        kx.ok() ? (*kx)->public_key() : std::string(replica::kChallengeKeyBytes, '\0');
  }
  if (absl::Status st = ch.Send(replica::EncodeChallenge(t.server_nonce, encrypt, t.server_public),
                                header_deadline);
      !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  char hello[replica::kHelloBytes];
  if (absl::Status st = ch.Recv(hello, sizeof hello, header_deadline); !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  std::string proof;
  bool client_encrypts = false;
  if (absl::Status st = replica::ParseHello(std::string_view(hello, sizeof hello), &t.client_nonce,
                                            &proof, &client_encrypts);
      !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  std::string key_proof;
  if (client_encrypts) {  // read whatever this end does, to answer in step
    std::string key_part(replica::kHelloKeyBytes, '\0');
    if (absl::Status st = ch.Recv(key_part.data(), key_part.size(), header_deadline); !st.ok()) {
      refuse(std::string(st.message()), false);
      return done();
    }
    t.client_public = key_part.substr(0, replica::kPublicKeyBytes);
    key_proof = key_part.substr(replica::kPublicKeyBytes);
  }
  if (token.empty()) {  // before this node's first round (SetRound)
    (void)ch.Send(replica::EncodeReply(false, absl::StrCat(fence, "this node is in no round yet")),
                  header_deadline);
    return done();
  }
  if (!replica::ProofHolds(replica::Proof("client", token, options_.job_id, t.server_nonce,
                                          t.client_nonce, client_encrypts),
                           proof)) {
    const std::string why =
        absl::StrCat(fence, "not an agent of this job (it did not prove the job's secret)");
    (void)ch.Send(replica::EncodeReply(false, why), header_deadline);
    LogLimited(absl::StrCat("--ckpt_replicas: refused a connection from ", peer,
                            ": it did not prove the job's secret (not an agent of this job)"));
    return done();
  }
  // An agent of this job with the other setting (another ddprun version):
  // refused, both ends told which.
  absl::Status keyed;
  bool first_no_cipher = false;
  if (client_encrypts != encrypt) {
    keyed = absl::FailedPreconditionError(encrypt ? replica::EncryptionMismatch(peer, endpoint_)
                                                  : replica::EncryptionMismatch(endpoint_, peer));
  } else if (encrypt) {
    keyed = kx.status();  // without libcrypto, its line names the fix
    if (!keyed.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      first_no_cipher = !said_no_cipher_;
      said_no_cipher_ = true;
    }
  }
  // The public keys that arrived must be the ones the client proved: else
  // someone on the path substituted theirs (checkpoint_replica_wire.h).
  absl::StatusOr<std::string> secret = absl::InternalError("");
  if (keyed.ok() && encrypt) {
    if (!replica::ProofHolds(replica::KeyProof("client", token, options_.job_id, t), key_proof)) {
      const std::string why = replica::KeyExchangeAltered(peer, endpoint_);
      (void)ch.Send(replica::EncodeReply(false, absl::StrCat(fence, why)), header_deadline);
      LogLimited(absl::StrCat("--ckpt_replicas: refused a connection from ", peer, ": ", why));
      return done();
    }
    secret = (*kx)->SharedSecret(t.client_public);
    if (!secret.ok()) {
      keyed = absl::InvalidArgumentError(
          absl::StrCat(peer, " sent ", secret.status().message(), "; the connection is refused"));
    }
  }
  if (!keyed.ok()) {
    (void)ch.Send(replica::EncodeReply(false, absl::StrCat(fence, keyed.message())),
                  header_deadline);
    if (client_encrypts != encrypt || absl::IsInvalidArgument(keyed)) {
      LogLimited(absl::StrCat("--ckpt_replicas: refused a connection: ", keyed.message()));
    } else if (first_no_cipher) {  // the same every time: said once
      log_(absl::StrCat("--ckpt_replicas: refusing every replica: ", keyed.message()));
    }
    return done();
  }
  std::string accept =
      replica::EncodeReply(true, "") +
      replica::Proof("server", token, options_.job_id, t.server_nonce, t.client_nonce, encrypt);
  if (encrypt) accept += replica::KeyProof("server", token, options_.job_id, t);
  if (absl::Status st = ch.Send(accept, header_deadline); !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  if (encrypt) {
    replica::ChannelKeys keys = replica::DeriveChannelKeys(token, options_.job_id, *secret, t);
    const absl::Status st = ch.Encrypt(keys.server_to_client, keys.client_to_server);
    kx->reset();  // the private key goes now, not with the connection
    replica::Wipe(&*secret);
    replica::Wipe(&keys.client_to_server);
    replica::Wipe(&keys.server_to_client);
    if (!st.ok()) {
      refuse(std::string(st.message()), false);
      return done();
    }
  }
  char prefix[replica::kPrefixBytes];
  Op op = Op::kPut;
  absl::StatusOr<std::uint32_t> len = absl::UnavailableError("");
  if (absl::Status st = ch.Recv(prefix, sizeof prefix, header_deadline); !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  len = replica::ParsePrefix(std::string_view(prefix, sizeof prefix), &op);
  if (!len.ok()) {
    refuse(std::string(len.status().message()), false);
    return done();
  }
  std::string body(*len, '\0');
  if (absl::Status st = ch.Recv(body.data(), body.size(), header_deadline); !st.ok()) {
    refuse(std::string(st.message()), false);
    return done();
  }
  absl::StatusOr<Header> h = replica::ParseHeader(op, body, options_.limit_bytes);
  if (!h.ok()) {
    if (absl::IsResourceExhausted(h.status())) {
      // Too large: one line per seat until one of it fits again.
      (void)ch.Send(replica::EncodeReply(false, std::string(h.status().message())), deadline);
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = !refused_large_;
        refused_large_ = true;
      }
      if (first)
        log_(absl::StrCat("--ckpt_replicas: refusing a replica from ", peer, ": ",
                          h.status().message()));
    } else {
      refuse(std::string(h.status().message()), true);
    }
    return done();
  }
  if (h->job_id != options_.job_id) {
    refuse(absl::StrCat(fence, "not a replica of this job (its job id differs)"), true);
    return done();
  }
  if (h->round != round) {
    refuse(absl::StrCat(fence, "a replica request of round ", h->round, " (stale)"), true);
    return done();
  }
  if (op == Op::kPut) {
    LowerThreadPriority();  // a replica arriving is background work; a kGet (a restore) is not
    auto r = store_.Begin(*h);
    if (!r.ok()) {
      refuse(absl::StrCat(fence, r.status().message()), true);
      return done();
    }
    for (int j = 0; j < h->seat.local_ranks; ++j) {
      const std::uint64_t n = h->sizes[static_cast<std::size_t>(j)];
      if (n == 0) continue;
      if (absl::Status st = ch.Recv((*r)->data(j), n, deadline); !st.ok()) {
        // The sender stopped midway (its worker saved over the slot): the
        // partial replica is dropped, the seat's older one stays. A record
        // that fails its tag says so.
        DDPRUN_DEBUG_LOG(kAgent) << fence << "replica of step " << h->step << " from " << peer
                                 << " cut short: " << st.message();
        if (absl::IsDataLoss(st) || absl::IsInvalidArgument(st)) {
          LogLimited(std::string(st.message()));
        }
        store_.Abandon(*std::move(r));
        return done();
      }
    }
    if (!store_.Commit(*std::move(r))) {
      DDPRUN_DEBUG_LOG(kAgent) << fence << "replica of step " << h->step << " from " << peer
                               << " not kept: the seat holds a newer one";
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      refused_large_ = false;
    }
    (void)ch.Send(replica::EncodeReply(true, ""), deadline);
    DDPRUN_DEBUG_LOG(kAgent) << fence << "holds the replica of step " << h->step << " of "
                             << Ranks(h->seat) << " from " << peer;
    return done();
  }
  // kGet: the seat's replica (of the step asked for, or its newest), as a
  // kPut of this round.
  std::shared_ptr<const HeldReplica> held =
      h->step == replica::kNewestStep ? store_.Find(h->seat) : store_.Find(h->seat, h->step);
  if (held == nullptr) {
    (void)ch.Send(replica::EncodeReply(false, absl::StrCat(fence, "no replica of ", Ranks(h->seat),
                                                           h->step == replica::kNewestStep
                                                               ? std::string()
                                                               : absl::StrCat(" at step ", h->step),
                                                           " here")),
                  deadline);
    return done();
  }
  Header put = *h;
  put.op = Op::kPut;
  put.step = held->step();
  put.sizes = held->sizes();
  put.crcs = held->crcs();
  put.kinds = held->kinds();
  absl::Status st = ch.Send(replica::EncodeReply(true, "") + replica::EncodeRequest(put), deadline);
  // The test hook: the first byte of a replica older than the seat's newest
  // goes out flipped, so the restore's checksum refuses it.
  bool spoil = test_corrupt_older_ && held != store_.Find(h->seat);
  for (int j = 0; st.ok() && j < put.seat.local_ranks; ++j) {
    std::string_view bytes(held->data(j), put.sizes[static_cast<std::size_t>(j)]);
    if (spoil && !bytes.empty()) {
      const char flipped = static_cast<char>(bytes[0] ^ 1);
      st = ch.Send(std::string_view(&flipped, 1), deadline);
      bytes.remove_prefix(1);
      spoil = false;
    }
    if (st.ok()) st = ch.Send(bytes, deadline);
  }
  DDPRUN_DEBUG_LOG(kAgent) << fence << "sent the replica of step " << put.step << " of "
                           << Ranks(put.seat) << " to " << peer << ": "
                           << (st.ok() ? "ok" : st.message());
  done();
}

// ------------------------------------------------------------------ client

absl::Status ReplicaService::Put(const std::string& endpoint, const Header& h,
                                 const std::vector<std::string_view>& data,
                                 Clock::time_point deadline, bool encrypt) {
  auto ch = Dial(endpoint, h.job_id, h.token, encrypt, deadline);
  if (!ch.ok()) return ch.status();
  if (absl::Status st = ch->Send(replica::EncodeRequest(h), deadline); !st.ok()) return st;
  for (std::string_view d : data) {
    if (absl::Status st = ch->Send(d, deadline); !st.ok()) {
      // A refusal sent before the data (too large): the reply says why.
      absl::Status reply = ReadReply(*ch, deadline);
      return reply.ok() ? st : reply;
    }
  }
  return ReadReply(*ch, deadline);
}

absl::StatusOr<FetchedReplica> ReplicaService::Fetch(const std::string& endpoint,
                                                     const std::string& job_id,
                                                     const std::string& token, std::int64_t round,
                                                     const replica::Seat& seat,
                                                     std::uint64_t limit_bytes,
                                                     Clock::time_point deadline, bool encrypt) {
  std::vector<std::string> bytes(static_cast<std::size_t>(std::max(seat.local_ranks, 0)));
  auto out = Fetch(endpoint, job_id, token, round, seat, limit_bytes, deadline, encrypt,
                   [&](int j, std::uint64_t size) -> absl::StatusOr<char*> {
                     bytes[static_cast<std::size_t>(j)].resize(size);
                     return bytes[static_cast<std::size_t>(j)].data();
                   });
  if (out.ok()) out->bytes = std::move(bytes);
  return out;
}

absl::StatusOr<FetchedReplica> ReplicaService::Fetch(
    const std::string& endpoint, const std::string& job_id, const std::string& token,
    std::int64_t round, const replica::Seat& seat, std::uint64_t limit_bytes,
    Clock::time_point deadline, bool encrypt, const FetchSink& sink, std::int64_t step) {
  auto ch = Dial(endpoint, job_id, token, encrypt, deadline);
  if (!ch.ok()) {
    if (absl::IsFailedPrecondition(ch.status())) return absl::NotFoundError(ch.status().message());
    return ch.status();
  }
  Header get;
  get.op = Op::kGet;
  get.job_id = job_id;
  get.token = token;
  get.round = round;
  get.seat = seat;
  get.step = step;
  if (absl::Status st = ch->Send(replica::EncodeRequest(get), deadline); !st.ok()) return st;
  if (absl::Status st = ReadReply(*ch, deadline); !st.ok()) {
    if (absl::IsFailedPrecondition(st)) return absl::NotFoundError(st.message());
    return st;
  }
  char prefix[replica::kPrefixBytes];
  if (absl::Status st = ch->Recv(prefix, sizeof prefix, deadline); !st.ok()) return st;
  Op op = Op::kGet;
  auto len = replica::ParsePrefix(std::string_view(prefix, sizeof prefix), &op);
  if (!len.ok()) return len.status();
  std::string body(*len, '\0');
  if (absl::Status st = ch->Recv(body.data(), body.size(), deadline); !st.ok()) return st;
  auto h = replica::ParseHeader(op, body, limit_bytes);
  if (!h.ok()) return h.status();
  if (op != Op::kPut || h->seat != seat || h->job_id != job_id || h->round != round ||
      (step != replica::kNewestStep && h->step != step)) {
    return absl::InvalidArgumentError(absl::StrCat(endpoint, " answered with another replica"));
  }
  FetchedReplica out;
  out.step = h->step;
  out.sizes = h->sizes;
  out.crcs = h->crcs;
  out.kinds = h->kinds;
  for (int j = 0; j < seat.local_ranks; ++j) {
    const auto i = static_cast<std::size_t>(j);
    const std::uint64_t n = h->sizes[i];
    absl::StatusOr<char*> dst = sink(j, n);
    if (!dst.ok()) return dst.status();
    // Received in pieces, each checksummed while it is still in the cache;
    // the socket buffer keeps filling meanwhile.
    std::uint32_t crc = 0;
    for (std::uint64_t at = 0; at < n;) {
      const std::uint64_t piece = std::min<std::uint64_t>(kFetchPiece, n - at);
      if (absl::Status st = ch->Recv(*dst + at, piece, deadline); !st.ok()) return st;
      crc = checkpoint_checksum::SnapshotChecksumUpdate(h->kinds[i], crc, *dst + at, piece);
      at += piece;
    }
    if (crc != h->crcs[i]) {
      return absl::DataLossError(absl::StrCat("the replica of step ", h->step, " of rank ",
                                              seat.base_rank + j, " from ", endpoint,
                                              " does not match its checksum"));
    }
  }
  return out;
}

// ------------------------------------------------------------------ sender

absl::StatusOr<bool> ReplicaService::SendSlot(replica::Channel& ch, int local_rank,
                                              const CommittedSnapshot& s,
                                              Clock::time_point deadline) {
  if (s.size == 0) return true;
  const int mem = memory_->fd(local_rank);
  const off_t offset =
      static_cast<off_t>(checkpoint_layout::SlotDataOffset(s.slot, memory_->slot_capacity()));
  void* p = ::mmap(nullptr, s.size, PROT_READ, MAP_SHARED, mem, offset);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of local rank ", local_rank,
                                            "'s checkpoint memory: ", std::strerror(errno)));
  }
  // Under --ckpt_bandwidth, in chunks each sent after its time at the rate.
  const std::size_t chunk = options_.bandwidth > 0 ? kPacedChunk : s.size;
  absl::Status st;
  for (std::size_t off = 0; st.ok() && off < s.size; off += chunk) {
    const std::size_t len = std::min(chunk, s.size - off);
    send_pace_.Take(len);
    st = ch.Send(std::string_view(static_cast<const char*>(p) + off, len), deadline);
  }
  ::munmap(p, s.size);
  if (!st.ok()) return st;
  for (const CommittedSnapshot& now : memory_->Committed(local_rank)) {
    if (now.slot == s.slot) return now.generation == s.generation && now.crc == s.crc;
  }
  return false;
}

void ReplicaService::SendLoop() {
  const BackgroundThreads::Member member(options_.background, kSendThreadName);
  LowerThreadPriority();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPollInterval);
    if (stop_) return;
    lock.unlock();
    SendNewest();
    lock.lock();
  }
}

void ReplicaService::SendNewest() {
  std::int64_t round = 0;
  std::string token, successor;
  bool reassert = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
    token = token_;
    successor = successor_;
    reassert = std::exchange(reassert_, false);
  }
  const int n = memory_->size();
  if (successor.empty() || n == 0) return;
  // The newest step every local rank committed, as one seat's ranks. Each
  // memory's epoch is read first: an ack is not recorded over contents
  // replaced meanwhile (CheckpointMemory::SetReplicaAcked).
  std::vector<std::uint64_t> epochs(static_cast<std::size_t>(n));
  std::vector<std::vector<CommittedSnapshot>> committed(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    epochs[j] = memory_->epoch(j);
    committed[j] = memory_->Committed(j);
  }
  std::vector<CommittedSnapshot> pick;
  for (const CommittedSnapshot& s0 : committed[0]) {  // newest first
    pick.assign(1, s0);
    for (int j = 1; j < n; ++j) {
      auto it = std::find_if(committed[j].begin(), committed[j].end(), [&](const auto& s) {
        return s.step == s0.step && s.rank == s0.rank + j && s.world_size == s0.world_size;
      });
      if (it == committed[j].end()) break;
      pick.push_back(*it);
    }
    if (static_cast<int>(pick.size()) == n) break;
    pick.clear();
  }
  if (pick.empty()) return;
  const std::int64_t step = pick[0].step;
  if (successor != sent_to_) {
    sent_step_ = -1;
    refused_step_ = -1;
    acked_.clear();
  }
  if (reassert && !acked_.empty()) {
    // A new round with the same successor: what it acknowledged still
    // holds, unless the contents were replaced since (the epoch refuses it).
    std::lock_guard<std::mutex> lock(mu_);
    if (successor_ == successor) {
      for (std::size_t j = 0; j < acked_.size() && static_cast<int>(j) < n; ++j) {
        (void)memory_->SetReplicaAcked(static_cast<int>(j), acked_[j].first, acked_[j].second);
      }
    }
  }
  bool held = acked_.size() == pick.size();
  for (std::size_t j = 0; held && j < pick.size(); ++j) {
    held = acked_[j] == std::make_pair(epochs[j], pick[j].generation);
  }
  if (held || (successor == sent_to_ && step == refused_step_)) return;
  if (successor == sent_to_ && Clock::now() < retry_at_) return;
  if (test_delay_.count() > 0) std::this_thread::sleep_for(test_delay_);
  Header h;
  h.op = Op::kPut;
  h.job_id = options_.job_id;
  h.token = token;
  h.round = round;
  h.seat = replica::Seat{pick[0].rank, n, pick[0].world_size};
  h.step = step;
  for (const CommittedSnapshot& s : pick) {
    h.sizes.push_back(s.size);
    h.crcs.push_back(s.crc);
    h.kinds.push_back(s.checksum_kind);
  }
  const auto deadline = Clock::now() + kIoTimeout;
  auto ch = Dial(successor, options_.job_id, token, options_.encrypt, deadline);
  absl::Status st = ch.ok() ? ch->Send(replica::EncodeRequest(h), deadline) : ch.status();
  // One local rank at a time, sent straight from its slot, which must still
  // hold the same commit afterwards (a save marks the record "writing"
  // before it touches the bytes): else the connection is dropped, the
  // receiver discards the partial replica, and the next poll tries again.
  // The receiver's Fetch checks every rank's CRC-32 at restore.
  for (int j = 0; st.ok() && j < n; ++j) {
    absl::StatusOr<bool> same = SendSlot(*ch, j, pick[j], deadline);
    if (!same.ok()) {
      st = same.status();
      break;
    }
    if (!*same) return;  // saved over: the next poll
  }
  if (st.ok() || ch.ok()) {
    absl::Status reply = ReadReply(*ch, deadline);
    if (st.ok() || absl::IsFailedPrecondition(reply)) st = reply;
  }
  sent_to_ = successor;
  const std::string fence = rendezvous::Fence(options_.job_id, round);
  if (st.ok()) {
    sent_step_ = step;
    send_failing_ = false;
    acked_.clear();
    for (std::size_t j = 0; j < pick.size(); ++j)
      acked_.emplace_back(epochs[j], pick[j].generation);
    {
      // Saves waiting on the gate go on (unless the round moved on meanwhile).
      std::lock_guard<std::mutex> lock(mu_);
      if (successor_ == successor) {
        for (int j = 0; j < n; ++j)
          (void)memory_->SetReplicaAcked(j, epochs[j], pick[j].generation);
      }
    }
    DDPRUN_DEBUG_LOG(kAgent) << fence << "replica of step " << step << " sent to " << successor;
    return;
  }
  {
    // Saves do not wait on a successor that cannot take the replica.
    std::lock_guard<std::mutex> lock(mu_);
    if (successor_ == successor) SetGatesLocked(false);
  }
  acked_.clear();
  if (absl::IsFailedPrecondition(st)) {
    refused_step_ = step;  // not sent again; a newer step is
    if (!send_failing_) {
      log_(absl::StrCat("--ckpt_replicas: ", successor, " refused the replica of step ", step, ": ",
                        st.message(), "; saves do not wait for the replica meanwhile"));
    }
    send_failing_ = true;
    return;
  }
  retry_at_ = Clock::now() + kRetryInterval;
  if (!send_failing_) {
    log_(absl::StrCat("--ckpt_replicas: cannot send the replica of step ", step, " to ", successor,
                      ": ", st.message(),
                      "; trying again, and saves do not wait for the replica meanwhile (said once "
                      "until a send succeeds)"));
  }
  send_failing_ = true;
}

}  // namespace ddprun::agent
