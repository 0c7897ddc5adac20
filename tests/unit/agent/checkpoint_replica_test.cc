// The replica protocol without sockets (checkpoint_replica_wire.h): a
// request round-trips, and everything a peer may send wrong is refused
// before anything is allocated; the receiver's store
// (checkpoint_replica_store.h): a replica is visible only once complete,
// a newer step wins, a reader keeps a replaced replica, the seats are
// bounded and a corrupted byte is caught by its CRC-32.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "ddprun/agent/checkpoint_replica_store.h"
#include "ddprun/agent/checkpoint_replica_wire.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"

namespace ddprun::agent {
namespace {

using replica::Header;
using replica::Op;
using replica::Seat;

Header PutHeader(std::int64_t step = 7, std::uint64_t size = 100) {
  Header h;
  h.op = Op::kPut;
  h.job_id = "job1";
  h.token = "tok";
  h.round = 3;
  h.seat = Seat{2, 2, 4};
  h.step = step;
  h.sizes = {size, size + 1};
  h.crcs = {11, 22};
  h.kinds = {1, 0};
  return h;
}

// Parses an encoded request back: prefix, then header.
absl::StatusOr<Header> RoundTrip(const std::string& wire, std::uint64_t limit) {
  Op op = Op::kGet;
  auto len = replica::ParsePrefix(std::string_view(wire).substr(0, replica::kPrefixBytes), &op);
  if (!len.ok()) return len.status();
  REQUIRE(wire.size() == replica::kPrefixBytes + *len);
  return replica::ParseHeader(op, std::string_view(wire).substr(replica::kPrefixBytes), limit);
}

std::uint32_t Crc(const std::string& s) {
  return static_cast<std::uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(s.data()), s.size()));
}

TEST_CASE("replica wire: a put and a get round-trip", "[unit][replica]") {
  auto h = RoundTrip(replica::EncodeRequest(PutHeader()), 1 << 20);
  REQUIRE(h.ok());
  CHECK(h->op == Op::kPut);
  CHECK(h->job_id == "job1");
  CHECK(h->token.empty());  // the key of the handshake, never on the wire
  CHECK(h->round == 3);
  CHECK(h->seat == Seat{2, 2, 4});
  CHECK(h->step == 7);
  CHECK(h->sizes == std::vector<std::uint64_t>{100, 101});
  CHECK(h->crcs == std::vector<std::uint32_t>{11, 22});
  CHECK(h->kinds == std::vector<std::uint32_t>{1, 0});
  CHECK(h->data_bytes() == 201);

  CHECK(replica::EncodeRequest(PutHeader()).find("tok") == std::string::npos);

  Header unknown_kind = PutHeader();
  unknown_kind.kinds = {1, 7};
  auto u = RoundTrip(replica::EncodeRequest(unknown_kind), 1 << 20);
  REQUIRE_FALSE(u.ok());
  CHECK_THAT(std::string(u.status().message()), Catch::Contains("unknown checksum kind 7"));

  Header get = PutHeader();
  get.op = Op::kGet;
  get.step = 0;
  auto g = RoundTrip(replica::EncodeRequest(get), 1 << 20);
  REQUIRE(g.ok());
  CHECK(g->op == Op::kGet);
  CHECK(g->sizes.empty());
}

TEST_CASE("replica wire: the handshake proves the job's secret without sending it",
          "[unit][replica][security]") {
  const std::string ns = replica::NewNonce(), nc = replica::NewNonce();
  CHECK(ns.size() == replica::kNonceBytes);
  CHECK(ns != nc);  // 128 random bits each
  bool encrypt = false;
  auto back = replica::ParseChallenge(replica::EncodeChallenge(ns, false), &encrypt);
  REQUIRE(back.ok());
  CHECK(*back == ns);
  CHECK_FALSE(encrypt);
  // An end that encrypts says so in its magic (--ckpt_encrypt), and its
  // X25519 public key follows.
  const std::string ps(replica::kPublicKeyBytes, 'P');
  const std::string sealed = replica::EncodeChallenge(ns, true, ps);
  REQUIRE(sealed.size() == replica::kChallengeBytes + replica::kChallengeKeyBytes);
  CHECK(sealed.substr(replica::kChallengeBytes) == ps);
  back = replica::ParseChallenge(sealed.substr(0, replica::kChallengeBytes), &encrypt);
  REQUIRE(back.ok());
  CHECK(*back == ns);
  CHECK(encrypt);
  CHECK_FALSE(replica::ParseChallenge("HTTP/1.1 200 OK\r\n\r\n1234", &encrypt).ok());
  // An encrypting server of the ddprun before the X25519 exchange is named.
  std::string older = sealed.substr(0, replica::kChallengeBytes);
  older[7] = 'E';
  CHECK(std::string(replica::ParseChallenge(older, &encrypt).status().message()) ==
        "an older ddprun's replica server (it encrypts without the X25519 exchange); run the "
        "same ddprun on every node");

  const std::string client = replica::Proof("client", "tok", "job1", ns, nc, false);
  CHECK(client.size() == replica::kProofBytes);
  const std::string hello = replica::EncodeHello(nc, client, false);
  REQUIRE(hello.size() == replica::kHelloBytes);
  CHECK(hello.find("tok") == std::string::npos);
  std::string got_nonce, got_proof;
  REQUIRE(replica::ParseHello(hello, &got_nonce, &got_proof, &encrypt).ok());
  CHECK(got_nonce == nc);
  CHECK_FALSE(encrypt);
  CHECK(replica::ProofHolds(client, got_proof));
  REQUIRE(
      replica::ParseHello(replica::EncodeHello(nc, client, true), &got_nonce, &got_proof, &encrypt)
          .ok());
  CHECK(encrypt);
  // Each input changes the proof: another token, job, role, nonce or setting.
  for (const std::string& other :
       {replica::Proof("client", "tok2", "job1", ns, nc, false),
        replica::Proof("client", "tok", "job2", ns, nc, false),
        replica::Proof("server", "tok", "job1", ns, nc, false),
        replica::Proof("client", "tok", "job1", nc, ns, false),
        replica::Proof("client", "tok", "job1", ns, replica::NewNonce(), false),
        replica::Proof("client", "tok", "job1", ns, nc, true)}) {
    CHECK_FALSE(replica::ProofHolds(client, other));
  }
  CHECK_FALSE(replica::ProofHolds(client, client.substr(1)));
  // The key proof covers the whole transcript: a public key changed on the
  // way (or a nonce, the token, the job or the role) and it does not hold.
  const replica::Transcript t{ns, nc, ps, std::string(replica::kPublicKeyBytes, 'c')};
  const std::string key_proof = replica::KeyProof("client", "tok", "job1", t);
  CHECK(key_proof.size() == replica::kProofBytes);
  CHECK(replica::ProofHolds(key_proof, replica::KeyProof("client", "tok", "job1", t)));
  for (int field = 0; field < 4; ++field) {
    replica::Transcript altered = t;
    std::string* f[] = {&altered.server_nonce, &altered.client_nonce, &altered.server_public,
                        &altered.client_public};
    (*f[field])[5] ^= 0x01;
    CHECK_FALSE(
        replica::ProofHolds(key_proof, replica::KeyProof("client", "tok", "job1", altered)));
  }
  CHECK_FALSE(replica::ProofHolds(key_proof, replica::KeyProof("client", "tok2", "job1", t)));
  CHECK_FALSE(replica::ProofHolds(key_proof, replica::KeyProof("client", "tok", "job2", t)));
  CHECK_FALSE(replica::ProofHolds(key_proof, replica::KeyProof("server", "tok", "job1", t)));
  CHECK(replica::KeyExchangeAltered("10.0.0.9:51234", "10.0.0.8:40211") ==
        "the X25519 key exchange between 10.0.0.9:51234 and 10.0.0.8:40211 was altered on the way "
        "(the public keys that arrived are not the ones the job's secret proved: someone on the "
        "path changed them); the connection is refused and no request or snapshot crossed it");
  // An older client (DDPREPL2) or garbage is not a hello.
  std::string old = hello;
  old[7] = '2';
  CHECK_THAT(std::string(replica::ParseHello(old, &got_nonce, &got_proof, &encrypt).message()),
             Catch::Contains("bad magic"));
  CHECK_FALSE(replica::ParseHello(hello.substr(1), &got_nonce, &got_proof, &encrypt).ok());
}
TEST_CASE("replica wire: garbage and lies are refused by name", "[unit][replica]") {
  Op op = Op::kPut;
  SECTION("bad magic") {
    auto len = replica::ParsePrefix("GET / HTTP/1.1\r\n", &op);
    REQUIRE_FALSE(len.ok());
    CHECK(std::string(len.status().message()).find("bad magic") != std::string::npos);
  }
  SECTION("unknown op and a huge header") {
    std::string p = replica::EncodeRequest(PutHeader()).substr(0, replica::kPrefixBytes);
    std::string bad_op = p;
    bad_op[8] = 9;
    CHECK(std::string(replica::ParsePrefix(bad_op, &op).status().message()) ==
          "unknown replica op 9");
    std::string huge = p;
    const std::uint32_t len = replica::kMaxHeaderBytes + 1;
    std::memcpy(huge.data() + 12, &len, 4);
    CHECK_FALSE(replica::ParsePrefix(huge, &op).ok());
  }
  SECTION("a header cut short, or with trailing bytes") {
    std::string body = replica::EncodeRequest(PutHeader()).substr(replica::kPrefixBytes);
    for (std::size_t cut : {std::size_t{0}, std::size_t{3}, body.size() - 1}) {
      CHECK_FALSE(replica::ParseHeader(Op::kPut, body.substr(0, cut), 1 << 20).ok());
    }
    CHECK(std::string(replica::ParseHeader(Op::kPut, body + "x", 1 << 20).status().message()) ==
          "a replica header with trailing bytes");
  }
  SECTION("a job id longer than the bound") {
    Header h = PutHeader();
    h.job_id.assign(replica::kMaxIdBytes + 1, 'j');
    CHECK_FALSE(RoundTrip(replica::EncodeRequest(h), 1 << 20).ok());
  }
  SECTION("ranks that are not a seat") {
    for (Seat s : {Seat{0, 0, 4}, Seat{3, 2, 4}, Seat{-1, 1, 4}, Seat{0, 2000, 4000}}) {
      Header h = PutHeader();
      h.seat = s;
      h.sizes.assign(static_cast<std::size_t>(std::max(s.local_ranks, 0)), 1);
      h.crcs.assign(h.sizes.size(), 0);
      auto r = RoundTrip(replica::EncodeRequest(h), 1 << 20);
      INFO(s.base_rank << "+" << s.local_ranks << " of " << s.world_size);
      REQUIRE_FALSE(r.ok());
      CHECK(absl::IsInvalidArgument(r.status()));
    }
  }
  SECTION("a snapshot larger than the receiver's limit names it and the flag") {
    auto r = RoundTrip(replica::EncodeRequest(PutHeader(7, 5 << 20)), 1 << 20);
    REQUIRE(absl::IsResourceExhausted(r.status()));
    CHECK(std::string(r.status().message()) ==
          "the replica of step 7 of rank 2 needs 5 MiB (5242880 bytes), more than this node's "
          "--ckpt_shm_limit (1048576 bytes per worker); raise --ckpt_shm_limit on this node");
  }
  SECTION("replies") {
    bool ok = true;
    const std::string refused = replica::EncodeReply(false, "no");
    auto len = replica::ParseReplyFixed(refused.substr(0, replica::kReplyFixedBytes), &ok);
    REQUIRE(len.ok());
    CHECK_FALSE(ok);
    CHECK(*len == 2);
    CHECK_FALSE(replica::ParseReplyFixed("\x07\0\0\0\0\0\0\0", &ok).ok());
  }
}

// Fills a begun replica with these bytes per rank (as the server's receive).
std::shared_ptr<HeldReplica> Filled(ReplicaStore& store, Seat seat, std::int64_t step,
                                    const std::vector<std::string>& bytes, std::int64_t round = 3) {
  Header h = PutHeader(step);
  h.seat = seat;
  h.round = round;
  h.sizes.clear();
  h.crcs.clear();
  h.kinds.clear();
  // Rank 0's checksum is CRC-32C (what the SDK library and the agent's
  // seed write), the others' zlib's CRC-32 (Python without the library).
  for (const std::string& b : bytes) {
    h.sizes.push_back(b.size());
    const bool c = h.kinds.empty();
    h.kinds.push_back(c ? checkpoint_layout::kChecksumCrc32c : checkpoint_layout::kChecksumCrc32);
    h.crcs.push_back(c ? checkpoint_checksum::Crc32c(0, b.data(), b.size()) : Crc(b));
  }
  auto r = store.Begin(h);
  REQUIRE(r.ok());
  for (std::size_t j = 0; j < bytes.size(); ++j) {
    if (!bytes[j].empty())
      std::memcpy((*r)->data(static_cast<int>(j)), bytes[j].data(), bytes[j].size());
  }
  return *r;
}

TEST_CASE("replica store: complete replicas only, the newest step per seat", "[unit][replica]") {
  ReplicaStore store;
  const Seat seat{2, 2, 4};
  auto r5 = Filled(store, seat, 5, {"five-a", "five-b"});
  CHECK(store.Find(seat) == nullptr);  // begun, not committed: invisible
  store.Commit(r5);
  auto held = store.Find(seat);
  REQUIRE(held != nullptr);
  CHECK(held->step() == 5);
  CHECK(*held->Read(0) == "five-a");
  CHECK(*held->Read(1) == "five-b");

  // A newer step replaces it; a reader of the old one keeps it.
  store.Commit(Filled(store, seat, 6, {"six-a", std::string(1 << 16, 's')}));
  CHECK(store.Find(seat)->step() == 6);
  CHECK(*held->Read(0) == "five-a");
  // An older one arriving late does not.
  store.Commit(Filled(store, seat, 4, {"four-a", "four-b"}));
  CHECK(store.Find(seat)->step() == 6);
  CHECK(store.Find(seat)->Read(1)->size() == (1u << 16));

  // At most kMaxSeats seats: the least recently received goes.
  store.Commit(Filled(store, Seat{0, 2, 4}, 6, {"a", "b"}));
  store.Commit(Filled(store, Seat{0, 1, 1}, 1, {""}));
  CHECK(store.All().size() == ReplicaStore::kMaxSeats);
  CHECK(store.Find(seat) == nullptr);
  CHECK(store.Find(Seat{0, 1, 1})->Read(0)->empty());
}

// Steps held for a seat, oldest first.
std::vector<std::int64_t> Steps(const ReplicaStore& store, const Seat& seat) {
  std::vector<std::int64_t> out;
  for (const auto& r : store.FindAll(seat)) out.push_back(r->step());
  return out;
}

// docs/checkpoint.md, "Replica lag": a save waits only for the replica of
// the snapshot before its newest, so a restore needs the seat's last two;
// the older goes when a transfer begins, so a seat holds two replicas'
// memory (two complete, or the newest and the arriving one), never three.
TEST_CASE(
    "replica store: the newest two replicas per seat; the older one goes when a transfer "
    "begins",
    "[unit][replica]") {
  ReplicaStore store;
  const Seat seat{2, 2, 4};
  const std::string a(8192, 'a'), b(8192, 'b');
  store.Commit(Filled(store, seat, 1, {a, b}));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{1});
  store.Commit(Filled(store, seat, 2, {b, a}));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{1, 2});
  CHECK(store.Find(seat)->step() == 2);
  CHECK(*store.Find(seat, 1)->Read(0) == a);  // both complete and readable
  CHECK(*store.Find(seat, 2)->Read(0) == b);
  CHECK(store.All().size() == 2);
  const char* step1 = store.Find(seat, 1)->data(0);

  // Step 3 begins: step 1 is evicted and its memory receives step 3; step 2
  // stays the seat's newest complete one until step 3 is.
  auto r3 = Filled(store, seat, 3, {a, a});
  CHECK(r3->data(0) == step1);
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{2});
  CHECK(store.Find(seat, 1) == nullptr);
  store.Commit(r3);
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{2, 3});

  // A transfer cut short (step 5): the newest stays; the one before it had
  // gone at the begin. The next transfer takes the abandoned memory.
  auto r5 = Filled(store, seat, 5, {b, b});
  const char* abandoned = r5->data(0);
  store.Abandon(std::move(r5));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{3});
  auto r6 = Filled(store, seat, 6, {b, a});
  CHECK(r6->data(0) == abandoned);
  store.Commit(r6);
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{3, 6});  // a step skipped: still two

  // The same step sent again replaces the newest; the previous one stays
  // (its begin evicted nothing).
  CHECK(store.Commit(Filled(store, seat, 6, {a, b})));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{3, 6});
  CHECK(*store.Find(seat, 6)->Read(0) == a);
  // An older step arriving after a newer one is not kept, and evicts nothing.
  CHECK(store.Commit(Filled(store, seat, 7, {a, a})));
  CHECK_FALSE(store.Commit(Filled(store, seat, 4, {b, b})));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{6, 7});
  // A reader of the evicted replica keeps its bytes; its memory is not reused.
  store.Commit(Filled(store, seat, 8, {b, b}));
  auto reader = store.Find(seat, 7);
  REQUIRE(reader != nullptr);
  auto r9 = Filled(store, seat, 9, {b, a});
  CHECK(r9->data(0) != reader->data(0));
  CHECK(*reader->Read(0) == a);
  store.Commit(r9);
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{8, 9});
}

// A job that went back to an older step (a restart that resumed from
// --ckpt_dir, say) puts that step again in a later round: what the seat held
// from the earlier round at or after it belongs to the timeline the job left
// and is never offered to a restore; what it held before it stays.
TEST_CASE("replica store: a later round's older step replaces the earlier round's later steps",
          "[unit][replica]") {
  ReplicaStore store;
  const Seat seat{2, 2, 4};
  const std::string a(4096, 'a'), b(4096, 'b'), c(4096, 'c');
  store.Commit(Filled(store, seat, 8, {a, a}, /*round=*/3));
  store.Commit(Filled(store, seat, 9, {b, b}, /*round=*/3));
  REQUIRE(Steps(store, seat) == std::vector<std::int64_t>{8, 9});

  // Round 4 resumed from step 5 and puts step 6: both are stale from its
  // begin, and step 6 is the seat's only replica once complete.
  auto r6 = Filled(store, seat, 6, {c, c}, /*round=*/4);
  CHECK(Steps(store, seat).empty());
  CHECK(store.Commit(r6));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{6});
  CHECK(*store.Find(seat, 6)->Read(0) == c);
  CHECK(store.Find(seat, 9) == nullptr);
  // Round 4 goes on: 7, then 8 (a new 8, not round 3's).
  CHECK(store.Commit(Filled(store, seat, 7, {a, b}, 4)));
  CHECK(store.Commit(Filled(store, seat, 8, {b, a}, 4)));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{7, 8});
  CHECK(*store.Find(seat, 8)->Read(0) == b);

  // Round 3's slow transfer of step 12 completing after round 4's puts is
  // older than them, whatever its step: not kept.
  CHECK_FALSE(store.Commit(Filled(store, seat, 12, {c, c}, 3)));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{7, 8});

  // Round 5 resumed from step 7 (held by every node) and puts step 8 again:
  // round 4's step 8 is stale, its step 7 stays as the previous one.
  CHECK(store.Commit(Filled(store, seat, 8, {c, a}, 5)));
  CHECK(Steps(store, seat) == std::vector<std::int64_t>{7, 8});
  CHECK(store.Find(seat, 8)->round() == 5);
  CHECK(*store.Find(seat, 8)->Read(0) == c);
  CHECK(store.Find(seat, 7)->round() == 4);
}

TEST_CASE("replica store: a replaced replica's memory is reused, never under a reader",
          "[unit][replica]") {
  ReplicaStore store;
  const Seat seat{2, 2, 4};
  const std::string a(8192, 'a'), b(8192, 'b');
  store.Commit(Filled(store, seat, 1, {a, b}));
  const char* first = store.Find(seat)->data(0);
  store.Commit(Filled(store, seat, 2, {b, a}));  // step 1's memory: the seat's spare
  auto r3 = Filled(store, seat, 3, {a, a});      // written into it
  CHECK(r3->data(0) == first);
  store.Commit(r3);
  CHECK(*store.Find(seat)->Read(0) == a);
  CHECK(*store.Find(seat)->Read(1) == a);

  // A reader holds step 3 while step 4 replaces it: its bytes stay.
  auto reader = store.Find(seat);
  store.Commit(Filled(store, seat, 4, {b, b}));
  auto r5 = Filled(store, seat, 5, {b, a});
  CHECK(r5->data(0) != reader->data(0));
  CHECK(*reader->Read(0) == a);
  CHECK(*reader->Read(1) == a);

  // An abandoned replica's memory (a transfer cut short) is the next one's.
  const char* abandoned = r5->data(0);
  store.Abandon(std::move(r5));
  auto r6 = Filled(store, seat, 6, {a, b});
  CHECK(r6->data(0) == abandoned);
  store.Commit(r6);
  // Other sizes get fresh memory of their own.
  store.Commit(Filled(store, seat, 7, {"x", "y"}));
  CHECK(*store.Find(seat)->Read(0) == "x");
  CHECK(*store.Find(seat)->Read(1) == "y");
}

TEST_CASE("replica store: a byte changed after receipt fails its checksum by rank, either kind",
          "[unit][replica]") {
  ReplicaStore store;
  auto r = Filled(store, Seat{2, 2, 4}, 9, {"abcdef", "ghijkl"});
  const int rank = GENERATE(0, 1);  // rank 0's checksum is CRC-32C, rank 1's CRC-32
  r->data(rank)[2] ^= 1;
  store.Commit(r);
  auto bad = store.Find(Seat{2, 2, 4})->Read(rank);
  REQUIRE(absl::IsDataLoss(bad.status()));
  CHECK(std::string(bad.status().message())
            .find("step 9 of rank " + std::to_string(2 + rank) + " has checksum") !=
        std::string::npos);
  CHECK(store.Find(Seat{2, 2, 4})->Read(1 - rank).ok());
}

}  // namespace
}  // namespace ddprun::agent
