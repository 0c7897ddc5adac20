// The replica transport (checkpoint_replicas.h) over real loopback sockets:
// put and fetch round-trip; requests of another job, token or round are
// refused; a client or a server that does not prove the job's secret gets
// nothing (the handshake, docs/security.md); a replica larger than the receiver's --ckpt_shm_limit
// is refused in one line; garbage connections are dropped with at most one line a second and the
// server goes on; the sender thread streams a node's newest committed step from its checkpoint
// memory to its successor; with --ckpt_encrypt, nothing crosses in the clear (a relay
// reads the wire), an altered record is refused, and ends of different settings refuse each other;
// an X25519 public key altered on the way is refused by name, and a recorded connection does not
// open with the job's token (forward secrecy); a receiving node without libcrypto (a child
// process) refuses in one line naming the fix.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_replicas.h"
#include "ddprun/agent/replica_cipher.h"

namespace ddprun::agent {
namespace {

using replica::Header;
using replica::Op;
using replica::Seat;
using Clock = ReplicaService::Clock;

// The lines a service logs.
struct Lines {
  std::mutex mu;
  std::vector<std::string> v;
  ReplicaService::LogFn Fn() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      v.push_back(m);
    };
  }
  std::vector<std::string> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return v;
  }
};

// The job's --ckpt_encrypt by default (the cases below run with it).
constexpr bool kEncrypt = ReplicaService::Options{}.encrypt;

std::unique_ptr<ReplicaService> Serve(Lines& lines, std::uint64_t limit,
                                      CheckpointMemory* memory = nullptr, bool encrypt = kEncrypt) {
  ReplicaService::Options o;
  o.job_id = "job1";
  o.host = "127.0.0.1";
  o.limit_bytes = limit;
  o.encrypt = encrypt;
  auto s = std::make_unique<ReplicaService>(o, memory, lines.Fn());
  REQUIRE(s->Start().ok());
  s->SetRound(2, "tok", "");
  return s;
}

std::uint32_t Crc(const std::string& s) {
  return static_cast<std::uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(s.data()), s.size()));
}

Header PutOf(const std::vector<std::string>& data, std::int64_t step = 5) {
  Header h;
  h.op = Op::kPut;
  h.job_id = "job1";
  h.token = "tok";
  h.round = 2;
  h.seat = Seat{2, static_cast<int>(data.size()), 4};
  h.step = step;
  for (const std::string& d : data) {
    h.sizes.push_back(d.size());
    h.crcs.push_back(Crc(d));
  }
  return h;
}

absl::Status PutAll(const std::string& endpoint, const Header& h,
                    const std::vector<std::string>& data, bool encrypt = kEncrypt) {
  std::vector<std::string_view> views(data.begin(), data.end());
  return ReplicaService::Put(endpoint, h, views, Clock::now() + std::chrono::seconds(10), encrypt);
}

absl::StatusOr<FetchedReplica> FetchSeat(const std::string& endpoint, std::int64_t round,
                                         const std::string& token = "tok",
                                         bool encrypt = kEncrypt) {
  return ReplicaService::Fetch(endpoint, "job1", token, round, Seat{2, 2, 4}, 1 << 20,
                               Clock::now() + std::chrono::seconds(10), encrypt);
}

// A loopback port nothing listens on (bound, then closed).
int UnusedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

void Garbage(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  (void)!::write(fd, bytes.data(), bytes.size());
  ::close(fd);
}

// Polls `ok` until it holds or 10 s pass.
template <typename F>
bool Eventually(F ok) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ok();
}

TEST_CASE("replica service: put, fetch and the fence", "[integration][replica]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20);
  const std::vector<std::string> data{"rank two bytes", std::string(300000, 'x')};
  REQUIRE(PutAll(server->endpoint(), PutOf(data), data).ok());
  auto got = FetchSeat(server->endpoint(), 2);
  REQUIRE(got.ok());
  CHECK(got->step == 5);
  CHECK(got->bytes == data);

  SECTION("another token, job or round is refused, naming the fence") {
    Header h = PutOf(data, 6);
    h.token = "other";
    absl::Status st = PutAll(server->endpoint(), h, data);
    CHECK(absl::IsFailedPrecondition(st));
    CHECK(std::string(st.message()) ==
          "[job job1 round 2] not an agent of this job (it did not prove the job's secret)");
    h = PutOf(data, 6);
    h.job_id = "job2";
    CHECK(absl::IsFailedPrecondition(PutAll(server->endpoint(), h, data)));
    h = PutOf(data, 6);
    h.round = 1;
    st = PutAll(server->endpoint(), h, data);
    CHECK(std::string(st.message()) == "[job job1 round 2] a replica request of round 1 (stale)");
    CHECK(server->store().Find(Seat{2, 2, 4})->step() == 5);
    auto wrong = FetchSeat(server->endpoint(), 2, "other");
    CHECK(absl::IsNotFound(wrong.status()));
    CHECK(std::string(wrong.status().message()).find("did not prove the job's secret") !=
          std::string::npos);
    auto stale = FetchSeat(server->endpoint(), 3);
    CHECK(std::string(stale.status().message()) ==
          "[job job1 round 2] a replica request of round 3 (stale)");
  }
  SECTION("a seat not held is NotFound") {
    auto none = ReplicaService::Fetch(server->endpoint(), "job1", "tok", 2, Seat{0, 2, 4}, 1 << 20,
                                      Clock::now() + std::chrono::seconds(10), kEncrypt);
    CHECK(absl::IsNotFound(none.status()));
    CHECK(std::string(none.status().message()) ==
          "[job job1 round 2] no replica of ranks 0-1 here");
  }
}

// A raw connection to `port` (the forged peer's side).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{10, 0};  // every read below has a deadline
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Reads until `n` bytes or the end of the stream (or the 10 s timeout).
std::string ReadUpTo(int fd, std::size_t n) {
  std::string out;
  char buf[4096];
  while (out.size() < n) {
    const ssize_t r = ::read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (r <= 0) break;
    out.append(buf, static_cast<std::size_t>(r));
  }
  return out;
}

TEST_CASE(
    "replica service: a client without the job's secret is refused naming the peer, and the "
    "real replica still works",
    "[integration][replica][security]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20);
  const std::vector<std::string> data{"real one", "real two"};
  REQUIRE(PutAll(server->endpoint(), PutOf(data), data).ok());
  const int port = PortOf(server->endpoint());

  // A forged client answers the challenge with a proof it made up, then
  // tries to push a replica.
  const int fd = Connect(port);
  const std::string challenge = ReadUpTo(fd, replica::kChallengeBytes);
  bool encrypt = false;
  REQUIRE(replica::ParseChallenge(challenge, &encrypt).ok());
  if (encrypt) REQUIRE(ReadUpTo(fd, replica::kChallengeKeyBytes).size() == 32);
  std::string forged = replica::EncodeHello(replica::NewNonce(), std::string(32, 'f'), encrypt);
  if (encrypt) forged += std::string(replica::kHelloKeyBytes, 'k');  // a key and its proof
  Header h = PutOf({"forged", "forged"}, 9);
  const std::string request = forged + replica::EncodeRequest(h) + "forgedforged";
  REQUIRE(::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  const std::string reply = ReadUpTo(fd, 1 << 16);
  ::close(fd);
  bool ok = true;
  REQUIRE(reply.size() >= replica::kReplyFixedBytes);
  REQUIRE(replica::ParseReplyFixed(reply.substr(0, replica::kReplyFixedBytes), &ok).ok());
  CHECK_FALSE(ok);
  CHECK(reply.substr(replica::kReplyFixedBytes) ==
        "[job job1 round 2] not an agent of this job (it did not prove the job's secret)");
  // A client that guessed another token: refused the same way.
  Header other = PutOf(data, 10);
  other.token = "guessed";
  CHECK(absl::IsFailedPrecondition(PutAll(server->endpoint(), other, data)));
  // One line per refusal (at most one a second), naming the peer.
  REQUIRE(Eventually([&] { return !lines.Get().empty(); }));
  for (const std::string& line : lines.Get()) {
    CHECK(line.rfind("--ckpt_replicas: refused a connection from 127.0.0.1:", 0) == 0);
    CHECK(line.find("it did not prove the job's secret (not an agent of this job)") !=
          std::string::npos);
  }
  // The held replica is the real one, and the real agents go on.
  auto held = FetchSeat(server->endpoint(), 2);
  REQUIRE(held.ok());
  CHECK(held->step == 5);
  CHECK(held->bytes == data);
  REQUIRE(PutAll(server->endpoint(), PutOf(data, 11), data).ok());
  CHECK(server->store().Find(Seat{2, 2, 4})->step() == 11);
}

TEST_CASE("replica service: a server without the job's secret gets no snapshot",
          "[integration][replica][security]") {
  // A forged server: it challenges, then answers with an ok and a made-up
  // proof, and records everything the sender sends.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string endpoint = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::string received;
  // The client's hello: encrypting, its public key and key proof follow.
  const std::size_t kHello = replica::kHelloBytes + (kEncrypt ? replica::kHelloKeyBytes : 0);
  std::thread forged([&] {
    const int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) return;
    timeval tv{10, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string challenge = replica::EncodeChallenge(
        replica::NewNonce(), kEncrypt, std::string(replica::kPublicKeyBytes, 'p'));
    (void)!::write(c, challenge.data(), challenge.size());
    received = ReadUpTo(c, kHello);
    const std::string answer = replica::EncodeReply(true, "") + std::string(32, 's');
    (void)!::write(c, answer.data(), answer.size());
    received += ReadUpTo(c, 1 << 20);  // until the sender closes
    ::close(c);
  });
  const std::vector<std::string> data{"secret snapshot", "of two ranks"};
  absl::Status st = PutAll(endpoint, PutOf(data), data);
  forged.join();
  ::close(listener);
  CHECK(absl::IsPermissionDenied(st));
  CHECK(std::string(st.message()) ==
        endpoint +
            " did not prove this job's secret (not an agent of job job1); nothing was "
            "sent to it");
  // It got the sender's hello (a nonce and proofs it cannot reuse, a public
  // key), and no header, token or snapshot byte.
  CHECK(received.size() == kHello);
  CHECK(received.find("tok") == std::string::npos);
  CHECK(received.find("secret snapshot") == std::string::npos);
}

TEST_CASE("replica service: a replica over the receiver's limit is refused in one line",
          "[integration][replica]") {
  Lines lines;
  auto server = Serve(lines, 64 * 1024);
  const std::vector<std::string> big{std::string(100, 'a'), std::string(1 << 20, 'b')};
  for (int i = 0; i < 3; ++i) {
    absl::Status st = PutAll(server->endpoint(), PutOf(big, 5 + i), big);
    REQUIRE(absl::IsFailedPrecondition(st));
    CHECK(std::string(st.message())
              .find("of rank 3 needs 1 MiB (1048576 bytes), more than this "
                    "node's --ckpt_shm_limit (65536 bytes per worker)") != std::string::npos);
  }
  CHECK(server->store().All().empty());
  REQUIRE(lines.Get().size() == 1);
  CHECK(lines.Get()[0].find("--ckpt_replicas: refusing a replica from 127.0.0.1:") == 0);
}

TEST_CASE("replica service: garbage is dropped, at most a line a second, and service goes on",
          "[integration][replica]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20);
  const int port = PortOf(server->endpoint());
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) Garbage(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  Garbage(port, std::string("DDPREPL1\x01\0\0\0\xff\xff\xff\x7f", 16));  // a huge header
  Garbage(port, std::string("DDPREPL1\x01\0\0\0\x08\0\0\0garbage!", 24));
  Garbage(port, "");  // connect and close
  const std::vector<std::string> data{"a", "b"};
  REQUIRE(Eventually([&] { return PutAll(server->endpoint(), PutOf(data), data).ok(); }));
  CHECK(FetchSeat(server->endpoint(), 2).ok());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto got = lines.Get();
  INFO(secs << " s");
  REQUIRE_FALSE(got.empty());
  CHECK(got.size() <= static_cast<std::size_t>(secs) + 1);
  CHECK(got[0].find("--ckpt_replicas: dropped a connection from 127.0.0.1:") == 0);
}

TEST_CASE("replica service: the sender streams the newest committed step to the successor",
          "[integration][replica]") {
  Lines lines;
  CheckpointMemory memory(1 << 20);
  REQUIRE(memory.Ensure(2).ok());
  REQUIRE(memory.Seed(0, 5, 2, 4, "rank 2 at step 5").ok());
  REQUIRE(memory.Seed(1, 5, 3, 4, std::string(200000, '3')).ok());
  auto receiver = Serve(lines, 1 << 20);
  auto sender = Serve(lines, 1 << 20, &memory);
  // The replica gate (checkpoint_layout.h): open without a successor.
  CHECK(memory.ReplicaGate(0) == 0);
  sender->SetRound(2, "tok", receiver->endpoint());
  REQUIRE(Eventually([&] {
    auto r = receiver->store().Find(Seat{2, 2, 4});
    return r != nullptr && r->step() == 5;
  }));
  // Closed up to the acknowledged snapshot (Seed writes generation 1).
  CHECK(Eventually([&] { return memory.ReplicaGate(0) == 2 && memory.ReplicaGate(1) == 2; }));
  auto held = receiver->store().Find(Seat{2, 2, 4});
  CHECK(*held->Read(0) == "rank 2 at step 5");
  CHECK(*held->Read(1) == std::string(200000, '3'));
  CHECK(Eventually([&] { return sender->sent_step() == 5; }));
  // A newer step follows; a rank that has not committed it holds it back.
  REQUIRE(memory.Seed(0, 6, 2, 4, "rank 2 at step 6").ok());
  std::this_thread::sleep_for(3 * ReplicaService::kPollInterval);
  CHECK(receiver->store().Find(Seat{2, 2, 4})->step() == 5);
  // New contents: nothing of them acknowledged, the gate stays closed.
  CHECK(memory.ReplicaGate(0) == 1);
  REQUIRE(memory.Seed(1, 6, 3, 4, "rank 3 at step 6").ok());
  REQUIRE(Eventually([&] { return receiver->store().Find(Seat{2, 2, 4})->step() == 6; }));
  CHECK(*receiver->store().Find(Seat{2, 2, 4})->Read(1) == "rank 3 at step 6");
  CHECK(Eventually([&] { return memory.ReplicaGate(0) == 2 && memory.ReplicaGate(1) == 2; }));
  CHECK(lines.Get().empty());
  // No successor: saves do not wait.
  sender->ClearSuccessor();
  CHECK(memory.ReplicaGate(0) == 0);
  CHECK(memory.ReplicaGate(1) == 0);
  // The same successor in the next round: what it acknowledged still holds.
  sender->SetRound(3, "tok", receiver->endpoint());
  CHECK(Eventually([&] { return memory.ReplicaGate(0) == 2 && memory.ReplicaGate(1) == 2; }));
  // A successor that is gone: closed, then opened by the failed send, with
  // the sender's line saying so.
  sender->ClearSuccessor();
  receiver.reset();
  sender->SetRound(4, "tok", "127.0.0.1:" + std::to_string(UnusedPort()));
  REQUIRE(Eventually([&] { return !lines.Get().empty(); }));
  CHECK(memory.ReplicaGate(0) == 0);
  CHECK(lines.Get()[0].find("saves do not wait for the replica meanwhile") != std::string::npos);
}

// A TCP relay in this process between replica clients and the service at
// `target`: it copies each connection both ways and keeps every byte that
// crossed; `flip_at` >= 0 flips one bit of that byte of each connection's
// client-to-server stream (`to_client`: server-to-client), an attacker on
// the path.
class Relay {
 public:
  explicit Relay(const std::string& target, long flip_at = -1, bool to_client = false)
      : target_port_(PortOf(target)), flip_at_(flip_at), flip_to_client_(to_client) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_, 4) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    endpoint_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~Relay() {
    ::shutdown(listener_, SHUT_RDWR);
    accept_.join();
    for (std::thread& t : pumps_) t.join();
    ::close(listener_);
  }
  const std::string& endpoint() const { return endpoint_; }
  // Everything that crossed, both directions.
  std::string Seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  // What crossed one way (every connection's, in the order they came).
  std::string Seen(bool to_server) {
    std::lock_guard<std::mutex> lock(mu_);
    return to_server ? to_server_ : to_client_;
  }

 private:
  void AcceptLoop() {
    for (;;) {
      const int c = ::accept(listener_, nullptr, nullptr);
      if (c < 0) return;
      const int s = Connect(target_port_);
      timeval tv{10, 0};  // a pump never waits longer for a byte
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      pumps_.emplace_back([this, c, s] { Pump(c, s, flip_to_client_ ? -1 : flip_at_, true); });
      pumps_.emplace_back([this, c, s] { Pump(s, c, flip_to_client_ ? flip_at_ : -1, false); });
    }
  }
  // Copies from -> to until the end of `from`, then ends `to`'s writes.
  void Pump(int from, int to, long flip_at, bool to_server) {
    char buf[1 << 16];
    long at = 0;
    for (;;) {
      const ssize_t r = ::read(from, buf, sizeof buf);
      if (r <= 0) break;
      if (flip_at >= at && flip_at < at + r) buf[flip_at - at] ^= 0x01;
      at += r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.append(buf, static_cast<std::size_t>(r));
        (to_server ? to_server_ : to_client_).append(buf, static_cast<std::size_t>(r));
      }
      // MSG_NOSIGNAL: the server may close first (a record it refused), and
      // SIGPIPE would end the whole test program.
      if (::send(to, buf, static_cast<std::size_t>(r), MSG_NOSIGNAL) != r) break;
    }
    ::shutdown(to, SHUT_WR);
    ::shutdown(from, SHUT_RD);
  }

  int target_port_;
  long flip_at_;
  bool flip_to_client_;
  int listener_ = -1;
  std::string endpoint_;
  std::thread accept_;
  std::vector<std::thread> pumps_;  // AcceptLoop's own until it returns
  std::mutex mu_;
  std::string seen_;
  std::string to_server_, to_client_;
};

// A snapshot whose bytes are easy to find on the wire.
std::string Pattern(std::size_t n) {
  std::string out;
  while (out.size() < n) out += "WEIGHTS-IN-THE-CLEAR-";
  out.resize(n);
  return out;
}

TEST_CASE(
    "replica service: encrypted, no snapshot byte, header or job id crosses in the clear and the "
    "restore is bit-identical; in plaintext the relay reads them",
    "[integration][replica][security]") {
  const bool encrypt = GENERATE(true, false);
  INFO("--ckpt_encrypt " << encrypt);
  Lines lines;
  auto server = Serve(lines, 1 << 20, nullptr, encrypt);
  const std::vector<std::string> data{Pattern(300000), "rank three: WEIGHTS-IN-THE-CLEAR-"};
  std::string seen;
  {
    Relay relay(server->endpoint());
    REQUIRE(PutAll(relay.endpoint(), PutOf(data), data, encrypt).ok());
    auto got = FetchSeat(relay.endpoint(), 2, "tok", encrypt);
    REQUIRE(got.ok());
    CHECK(got->step == 5);
    CHECK(got->bytes == data);  // bit-identical after both ways through the relay
    seen = relay.Seen();
  }
  // Both snapshots went out (put) and came back (fetch).
  CHECK(seen.size() > 2 * (data[0].size() + data[1].size()));
  CHECK((seen.find("WEIGHTS-IN-THE-CLEAR-") == std::string::npos) == encrypt);
  // The job id goes with each request (the put's and the fetch's), so a
  // leak shows it at least twice; ciphertext holds the 4 bytes by chance
  // about once in 4 GiB, twice in 1.2 MB practically never.
  std::size_t job_ids = 0;
  for (auto at = seen.find("job1"); at != std::string::npos; at = seen.find("job1", at + 1)) {
    ++job_ids;
  }
  if (encrypt) {
    CHECK(job_ids < 2);
  } else {
    CHECK(job_ids >= 2);
  }
  CHECK((seen.find("DDPREPL3") == std::string::npos) == encrypt);  // the request's prefix
  // The token is never sent (the handshake's unit test, "proves the job's
  // secret without sending it"). Only the plaintext stream can be searched
  // for it here: the test's token is 3 bytes, which a megabyte of
  // ciphertext holds by chance (a 3-byte string: about once in 16 MiB).
  if (!encrypt) CHECK(seen.find("tok") == std::string::npos);
  CHECK(lines.Get().empty());
}

TEST_CASE(
    "replica service: a record altered on the way is refused in one line naming the peer; the "
    "held replica stays",
    "[integration][replica][security]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20, nullptr, true);
  const std::vector<std::string> data{"rank two at step 5", "rank three at step 5"};
  REQUIRE(PutAll(server->endpoint(), PutOf(data), data, true).ok());
  // One bit of the client's stream, past its hello: inside the snapshot's
  // records.
  Relay relay(server->endpoint(),
              static_cast<long>(replica::kHelloBytes + replica::kHelloKeyBytes) + 5000);
  const std::vector<std::string> next{Pattern(100000), Pattern(100000)};
  CHECK_FALSE(PutAll(relay.endpoint(), PutOf(next, 6), next, true).ok());
  REQUIRE(Eventually([&] { return !lines.Get().empty(); }));
  const std::string line = lines.Get()[0];
  CHECK(line.rfind("--ckpt_encrypt: a record from 127.0.0.1:", 0) == 0);
  CHECK(line.find("failed its authentication") != std::string::npos);
  CHECK(line.find('\n') == std::string::npos);
  // Nothing of the altered replica is held or served.
  auto held = FetchSeat(server->endpoint(), 2, "tok", true);
  REQUIRE(held.ok());
  CHECK(held->step == 5);
  CHECK(held->bytes == data);
}

TEST_CASE(
    "replica service: an end that encrypts and one that does not refuse each other in one line "
    "naming both",
    "[integration][replica][security]") {
  Lines lines;
  const bool server_encrypts = GENERATE(true, false);
  auto server = Serve(lines, 1 << 20, nullptr, server_encrypts);
  const std::vector<std::string> data{"a", "b"};
  absl::Status st = PutAll(server->endpoint(), PutOf(data), data, !server_encrypts);
  REQUIRE(absl::IsFailedPrecondition(st));
  const std::string msg(st.message());
  INFO(msg);
  CHECK(msg.rfind("[job job1 round 2] 127.0.0.1:", 0) == 0);
  CHECK(msg.find("does not encrypt the replica channel and 127.0.0.1:") != std::string::npos);
  CHECK(msg.find("(--ckpt_encrypt 1); run the same ddprun on every node") != std::string::npos);
  CHECK(server->store().All().empty());
  auto fetched = FetchSeat(server->endpoint(), 2, "tok", !server_encrypts);
  CHECK(absl::IsNotFound(fetched.status()));
  CHECK(std::string(fetched.status().message()).find("does not encrypt") != std::string::npos);
  REQUIRE(Eventually([&] { return !lines.Get().empty(); }));
  CHECK(lines.Get()[0].rfind("--ckpt_replicas: refused a connection: 127.0.0.1:", 0) == 0);
  // The same setting on both ends goes on.
  CHECK(PutAll(server->endpoint(), PutOf(data), data, server_encrypts).ok());
}

TEST_CASE(
    "replica service: an X25519 public key altered on the way, either way, is refused in one line "
    "naming both ends; nothing crosses and the held replica stays",
    "[integration][replica][security]") {
  const bool client_key = GENERATE(true, false);
  INFO((client_key ? "the client's public key" : "the server's public key"));
  Lines lines;
  auto server = Serve(lines, 1 << 20, nullptr, true);
  const std::vector<std::string> data{"rank two at step 5", "rank three at step 5"};
  REQUIRE(PutAll(server->endpoint(), PutOf(data), data, true).ok());
  // One bit of the client's public key (after its hello) or of the
  // server's (after its challenge).
  const long at = static_cast<long>(client_key ? replica::kHelloBytes : replica::kChallengeBytes);
  std::string to_server;
  absl::Status st;
  {
    Relay relay(server->endpoint(), at + 3, /*to_client=*/!client_key);
    st = PutAll(relay.endpoint(), PutOf({"forged two", "forged three"}, 6),
                {"forged two", "forged three"}, true);
    to_server = relay.Seen(true);
  }
  REQUIRE(absl::IsFailedPrecondition(st));
  const std::string msg(st.message());
  INFO(msg);
  CHECK(msg.rfind("[job job1 round 2] the X25519 key exchange between 127.0.0.1:", 0) == 0);
  CHECK(msg.find(" and " + server->endpoint() + " was altered on the way") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  REQUIRE(Eventually([&] { return !lines.Get().empty(); }));
  const std::string line = lines.Get()[0];
  CHECK(line.rfind("--ckpt_replicas: refused a connection from 127.0.0.1:", 0) == 0);
  CHECK(line.find("was altered on the way") != std::string::npos);
  // The client sent its hello and nothing after it.
  CHECK(to_server.size() == replica::kHelloBytes + replica::kHelloKeyBytes);
  auto held = FetchSeat(server->endpoint(), 2, "tok", true);
  REQUIRE(held.ok());
  CHECK(held->step == 5);
  CHECK(held->bytes == data);
}

TEST_CASE(
    "replica service: a recorded connection does not open with the job's token: its keys need "
    "the X25519 secret, gone with the connection",
    "[integration][replica][security]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20, nullptr, true);
  const std::vector<std::string> data{Pattern(5000), "rank three: WEIGHTS-IN-THE-CLEAR-"};
  std::string to_server, to_client;
  {
    Relay relay(server->endpoint());
    REQUIRE(PutAll(relay.endpoint(), PutOf(data), data, true).ok());
    to_server = relay.Seen(true);
    to_client = relay.Seen(false);
  }
  // What crossed in the clear: the transcript.
  REQUIRE(to_client.size() > replica::kChallengeBytes + replica::kChallengeKeyBytes);
  const std::size_t first_record = replica::kHelloBytes + replica::kHelloKeyBytes;
  REQUIRE(to_server.size() > first_record + replica::kRecordHeaderBytes);
  const replica::Transcript t{to_client.substr(8, replica::kNonceBytes),
                              to_server.substr(8, replica::kNonceBytes),
                              to_client.substr(replica::kChallengeBytes, replica::kPublicKeyBytes),
                              to_server.substr(replica::kHelloBytes, replica::kPublicKeyBytes)};
  // The client's first record is the request's prefix and header.
  std::string record = to_server.substr(first_record);
  auto n = replica::RecordOpener::Length(record.data());
  REQUIRE(n.ok());
  CHECK(*n == replica::EncodeRequest(PutOf(data)).size());
  REQUIRE(record.size() >= replica::kRecordHeaderBytes + *n + replica::kTagBytes);
  // Whoever recorded it and learned the token: the keys of the ddprun before
  // the exchange (the token salted with the nonces), and the token with the
  // whole transcript in the secret's place.
  const std::string before = replica::HkdfSha256(
      "tok", t.server_nonce + t.client_nonce,
      std::string("ddprun replica aes-256-gcm client->server\0job1", 46), replica::kKeyBytes);
  for (const std::string& key :
       {before, replica::DeriveChannelKeys("tok", "job1", "", t).client_to_server,
        replica::DeriveChannelKeys("tok", "job1", t.server_public, t).client_to_server,
        replica::DeriveChannelKeys("tok", "job1", t.client_public, t).client_to_server}) {
    auto opener = replica::RecordOpener::Create(key);
    REQUIRE(opener.ok());
    std::string copy = record;
    char* p = copy.data() + replica::kRecordHeaderBytes;
    CHECK(absl::IsDataLoss((*opener)->Open(copy.data(), p, *n, p + *n)));
  }
}

// Run by the case below in a fresh process whose LoadCipherLibrary finds no
// libcrypto (kEnvTestCryptoLibrary): an encrypting server; prints its
// endpoint, serves until its stdin ends, then prints the lines it logged.
TEST_CASE("child process: an encrypting replica server without libcrypto",
          "[.][replica_nocrypto_child]") {
  Lines lines;
  auto server = Serve(lines, 1 << 20, nullptr, true);
  std::printf("ENDPOINT:%s\n", server->endpoint().c_str());
  std::fflush(stdout);
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  // The refusal is logged after its reply was sent.
  (void)Eventually([&] {
    for (const std::string& line : lines.Get()) {
      if (line.find("refusing every replica") != std::string::npos) return true;
    }
    return false;
  });
  for (const std::string& line : lines.Get()) std::printf("LOG:%s\n", line.c_str());
  std::fflush(stdout);
}

TEST_CASE(
    "replica service: a receiving node without libcrypto refuses in one line naming the fix; "
    "its challenge's key is zeros and the sender is told the same line",
    "[integration][replica][security]") {
  int out[2], in[2];
  REQUIRE(::pipe(out) == 0);
  REQUIRE(::pipe(in) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv(replica::kEnvTestCryptoLibrary, "libcrypto-not-here.so.3", 1);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(in[0], STDIN_FILENO);
    ::close(out[0]);
    ::close(in[1]);
    ::execl("/proc/self/exe", "integration_tests", "[replica_nocrypto_child]", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(in[0]);
  // Reads the child's output until `what` is in it, it ends, or 10 s pass
  // without a byte.
  std::string got;
  auto read_until = [&](const std::string& what) {
    pollfd p{out[0], POLLIN, 0};
    while (got.find(what) == std::string::npos && ::poll(&p, 1, 10000) > 0) {
      char buf[4096];
      const ssize_t r = ::read(out[0], buf, sizeof buf);
      if (r <= 0) break;
      got.append(buf, static_cast<std::size_t>(r));
    }
  };
  read_until("\n");
  const std::size_t at = got.find("ENDPOINT:");
  absl::Status st = absl::UnknownError("the child printed no endpoint");
  std::string challenge;
  if (at != std::string::npos) {
    const std::string endpoint = got.substr(at + 9, got.find('\n', at) - at - 9);
    const int fd = Connect(PortOf(endpoint));
    challenge = ReadUpTo(fd, replica::kChallengeBytes + replica::kChallengeKeyBytes);
    ::close(fd);
    const std::vector<std::string> data{"a", "b"};
    st = PutAll(endpoint, PutOf(data), data, true);
  }
  ::close(in[1]);  // the child prints its lines and ends
  read_until("libcrypto-not-here.so.3 (");
  ::close(out[0]);
  int status = 0;
  const bool ended = Eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; });
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  INFO(got);
  REQUIRE(challenge.size() == replica::kChallengeBytes + replica::kChallengeKeyBytes);
  bool encrypt = false;
  CHECK(replica::ParseChallenge(challenge.substr(0, replica::kChallengeBytes), &encrypt).ok());
  CHECK(encrypt);
  CHECK(challenge.substr(replica::kChallengeBytes) ==
        std::string(replica::kChallengeKeyBytes, '\0'));
  REQUIRE(absl::IsFailedPrecondition(st));
  const std::string msg(st.message());
  CHECK(msg.rfind("[job job1 round 2] --ckpt_encrypt: cannot load libcrypto-not-here.so.3 (", 0) ==
        0);
  CHECK(msg.find("install OpenSSL 3's library (Debian and Ubuntu: libssl3) on this node, or run "
                 "the job with --ckpt_encrypt 0") != std::string::npos);
  CHECK(got.find("LOG:--ckpt_replicas: refusing every replica: --ckpt_encrypt: cannot load "
                 "libcrypto-not-here.so.3") != std::string::npos);
}

}  // namespace
}  // namespace ddprun::agent
