// The replica channel's encryption (replica_cipher.h), no sockets: AES-256-GCM
// against the GCM specification's test cases (McGrew and Viega, the NIST
// submission: cases 15 and 16), HKDF-SHA256 against RFC 5869, X25519
// against RFC 7748, and the record layer: a record altered, replayed,
// reordered or opened under another key fails its tag. Forward secrecy: the
// keys depend on each connection's X25519 secret, so equal nonces and token
// give other keys, and records sealed under them do not open with what the
// token and a recorded transcript give.
#include "ddprun/agent/replica_cipher.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ddprun::agent::replica {
namespace {

std::string Hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

// A transcript of fixed fields (the channel's keys' salt).
Transcript Script() {
  return Transcript{"server nonce 16b", "client nonce 16b", std::string(kPublicKeyBytes, 'S'),
                    std::string(kPublicKeyBytes, 'C')};
}
std::string SealAll(std::string_view key, const std::vector<std::string>& texts);
absl::StatusOr<std::vector<std::string>> OpenAll(std::string_view key, std::string wire);

const std::string kKey = Hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
const std::string kIv = Hex("cafebabefacedbaddecaf888");

TEST_CASE("replica cipher: AES-256-GCM gives the GCM specification's test cases 15 and 16",
          "[unit][replica][security]") {
  REQUIRE(LoadCipherLibrary().ok());
  auto gcm = Aes256Gcm::Create(kKey);
  REQUIRE(gcm.ok());
  struct Case {
    std::string plain, aad, cipher, tag;
  };
  const Case cases[] = {
      // Test case 15: 64 bytes, no associated data.
      {Hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
           "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255"),
       "",
       Hex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
           "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad"),
       Hex("b094dac5d93471bdec1a502270e3cc6c")},
      // Test case 16: 60 bytes, 20 bytes of associated data.
      {Hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
           "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"),
       Hex("feedfacedeadbeeffeedfacedeadbeefabaddad2"),
       Hex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
           "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"),
       Hex("76fc6ece0f4e1768cddf8853bb2d551b")},
  };
  for (const Case& c : cases) {
    std::string out(c.plain.size(), '\0');
    char tag[kTagBytes];
    REQUIRE((*gcm)->Seal(kIv, c.aad, c.plain.data(), c.plain.size(), out.data(), tag).ok());
    CHECK(out == c.cipher);
    CHECK(std::string(tag, kTagBytes) == c.tag);
    // And back, in place.
    std::string back = c.cipher;
    REQUIRE((*gcm)->Open(kIv, c.aad, back.data(), back.size(), back.data(), c.tag.data()).ok());
    CHECK(back == c.plain);
    // One bit anywhere (ciphertext, tag, associated data, nonce) and the tag
    // does not hold.
    std::string bad = c.cipher;
    bad[7] ^= 1;
    CHECK(absl::IsDataLoss(
        (*gcm)->Open(kIv, c.aad, bad.data(), bad.size(), bad.data(), c.tag.data())));
    std::string bad_tag = c.tag;
    bad_tag[15] ^= 0x80;
    bad = c.cipher;
    CHECK(absl::IsDataLoss(
        (*gcm)->Open(kIv, c.aad, bad.data(), bad.size(), bad.data(), bad_tag.data())));
    bad = c.cipher;
    CHECK(absl::IsDataLoss(
        (*gcm)->Open(kIv, c.aad + "x", bad.data(), bad.size(), bad.data(), c.tag.data())));
    std::string iv = kIv;
    iv[11] ^= 1;
    bad = c.cipher;
    CHECK(absl::IsDataLoss(
        (*gcm)->Open(iv, c.aad, bad.data(), bad.size(), bad.data(), c.tag.data())));
  }
  CHECK(absl::IsInvalidArgument(Aes256Gcm::Create("short").status()));
}

TEST_CASE("replica cipher: HKDF-SHA256 gives RFC 5869's test case 1; each direction its key",
          "[unit][replica][security]") {
  CHECK(
      HkdfSha256(Hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"),
                 Hex("000102030405060708090a0b0c"), Hex("f0f1f2f3f4f5f6f7f8f9"), 42) ==
      Hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"));
  const std::string secret(kSharedSecretBytes, 's');
  const ChannelKeys k = DeriveChannelKeys("tok", "job1", secret, Script());
  CHECK(k.client_to_server.size() == kKeyBytes);
  CHECK(k.server_to_client.size() == kKeyBytes);
  CHECK(k.client_to_server != k.server_to_client);
  // Another token, job, secret, nonce or public key: other keys.
  auto with = [](int field) {
    Transcript t = Script();
    std::string* f[] = {&t.server_nonce, &t.client_nonce, &t.server_public, &t.client_public};
    (*f[field])[0] ^= 1;
    return t;
  };
  for (const ChannelKeys& o :
       {DeriveChannelKeys("tok2", "job1", secret, Script()),
        DeriveChannelKeys("tok", "job2", secret, Script()),
        DeriveChannelKeys("tok", "job1", std::string(kSharedSecretBytes, 't'), Script()),
        DeriveChannelKeys("tok", "job1", secret, with(0)),
        DeriveChannelKeys("tok", "job1", secret, with(1)),
        DeriveChannelKeys("tok", "job1", secret, with(2)),
        DeriveChannelKeys("tok", "job1", secret, with(3))}) {
    CHECK(o.client_to_server != k.client_to_server);
    CHECK(o.server_to_client != k.server_to_client);
  }
}

TEST_CASE("replica cipher: X25519 gives RFC 7748's test vectors; both ends the same secret",
          "[unit][replica][security]") {
  // RFC 7748, section 6.1: Alice's and Bob's key pairs and their secret.
  auto alice = KeyExchange::FromPrivateKey(
      Hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"));
  auto bob = KeyExchange::FromPrivateKey(
      Hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"));
  REQUIRE(alice.ok());
  REQUIRE(bob.ok());
  CHECK((*alice)->public_key() ==
        Hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"));
  CHECK((*bob)->public_key() ==
        Hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"));
  const std::string shared =
      Hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  CHECK(*(*alice)->SharedSecret((*bob)->public_key()) == shared);
  CHECK(*(*bob)->SharedSecret((*alice)->public_key()) == shared);
  // Fresh pairs: new public keys each time, the same secret at both ends.
  auto a = KeyExchange::Create();
  auto b = KeyExchange::Create();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->public_key().size() == kPublicKeyBytes);
  CHECK((*a)->public_key() != (*b)->public_key());
  CHECK(*(*a)->SharedSecret((*b)->public_key()) == *(*b)->SharedSecret((*a)->public_key()));
  // A key of another size, or a low-order point (the all-zero secret), is
  // refused by name.
  CHECK(absl::IsInvalidArgument((*a)->SharedSecret("short").status()));
  const absl::Status zero = (*a)->SharedSecret(std::string(kPublicKeyBytes, '\0')).status();
  CHECK(absl::IsInvalidArgument(zero));
  CHECK(std::string(zero.message()).find("low-order point") != std::string::npos);
  CHECK(absl::IsInvalidArgument(KeyExchange::FromPrivateKey("short").status()));
}

// One connection's handshake at both ends, as checkpoint_replicas.cc runs
// it, with the nonces given: the keys each end derives.
struct Connection {
  Transcript transcript;
  ChannelKeys client, server;
};
Connection Handshake(std::string_view token, std::string_view ns, std::string_view nc) {
  auto server = KeyExchange::Create();
  auto client = KeyExchange::Create();
  REQUIRE(server.ok());
  REQUIRE(client.ok());
  Connection c;
  c.transcript = Transcript{std::string(ns), std::string(nc), (*server)->public_key(),
                            (*client)->public_key()};
  auto at_client = (*client)->SharedSecret(c.transcript.server_public);
  auto at_server = (*server)->SharedSecret(c.transcript.client_public);
  REQUIRE(at_client.ok());
  REQUIRE(at_server.ok());
  c.client = DeriveChannelKeys(token, "job1", *at_client, c.transcript);
  c.server = DeriveChannelKeys(token, "job1", *at_server, c.transcript);
  return c;
}

TEST_CASE(
    "replica cipher: two connections with the same token and the same nonces get different keys "
    "(each from its own X25519 secret); both ends of one get the same",
    "[unit][replica][security]") {
  const Connection one = Handshake("tok", "server nonce 16b", "client nonce 16b");
  const Connection two = Handshake("tok", "server nonce 16b", "client nonce 16b");
  CHECK(one.client.client_to_server == one.server.client_to_server);
  CHECK(one.client.server_to_client == one.server.server_to_client);
  CHECK(one.client.client_to_server != two.client.client_to_server);
  CHECK(one.client.server_to_client != two.client.server_to_client);
  // Even over the first connection's whole transcript (its nonces and
  // public keys), the second one's secret gives other keys: the keys hang
  // on the secret, not only on what crossed the wire.
  auto other = KeyExchange::Create();
  REQUIRE(other.ok());
  const ChannelKeys swapped = DeriveChannelKeys(
      "tok", "job1", *(*other)->SharedSecret(one.transcript.server_public), one.transcript);
  CHECK(swapped.client_to_server != one.client.client_to_server);
}

TEST_CASE(
    "replica cipher: a recorded connection does not open with the token and its transcript "
    "alone",
    "[unit][replica][security]") {
  const Connection c = Handshake("tok", "server nonce 16b", "client nonce 16b");
  const std::vector<std::string> texts{"DDPREPL3 header", "the weights"};
  const std::string wire = SealAll(c.client.client_to_server, texts);
  // The server's key opens it (the check can pass)...
  auto opened = OpenAll(c.server.client_to_server, wire);
  REQUIRE(opened.ok());
  CHECK(*opened == texts);
  // ...and nothing that someone who recorded the connection and learned the
  // token can compute does: keys from the token with the recorded transcript
  // in place of the secret, or none, or the token alone salted with the
  // nonces (the keys before the X25519 exchange).
  const Transcript& t = c.transcript;
  for (const std::string& guess :
       {DeriveChannelKeys("tok", "job1", "", t).client_to_server,
        DeriveChannelKeys("tok", "job1", std::string(kSharedSecretBytes, '\0'), t).client_to_server,
        DeriveChannelKeys("tok", "job1", t.server_public, t).client_to_server,
        DeriveChannelKeys("tok", "job1", t.client_public, t).client_to_server,
        HkdfSha256("tok", t.server_nonce + t.client_nonce,
                   std::string("ddprun replica aes-256-gcm client->server\0job1", 46),
                   kKeyBytes)}) {
    CHECK(absl::IsDataLoss(OpenAll(guess, wire).status()));
  }
}

// Seals `texts` as records, one after the other.
std::string SealAll(std::string_view key, const std::vector<std::string>& texts) {
  auto sealer = RecordSealer::Create(key);
  REQUIRE(sealer.ok());
  std::string wire;
  for (const std::string& t : texts) REQUIRE((*sealer)->Seal(t.data(), t.size(), &wire).ok());
  return wire;
}

// Opens the records of `wire` in order; the plaintexts, or the first error.
absl::StatusOr<std::vector<std::string>> OpenAll(std::string_view key, std::string wire) {
  auto opener = RecordOpener::Create(key);
  REQUIRE(opener.ok());
  std::vector<std::string> out;
  for (std::size_t at = 0; at < wire.size();) {
    auto n = RecordOpener::Length(wire.data() + at);
    if (!n.ok()) return n.status();
    if (wire.size() - at < kRecordHeaderBytes + *n + kTagBytes) {
      return absl::OutOfRangeError("a record cut short");
    }
    char* data = wire.data() + at + kRecordHeaderBytes;
    if (absl::Status st = (*opener)->Open(wire.data() + at, data, *n, data + *n); !st.ok()) {
      return st;
    }
    out.emplace_back(data, *n);
    at += kRecordHeaderBytes + *n + kTagBytes;
  }
  return out;
}

TEST_CASE("replica cipher: records open in order under their key, and nothing else opens",
          "[unit][replica][security]") {
  const ChannelKeys k =
      DeriveChannelKeys("tok", "job1", std::string(kSharedSecretBytes, 's'), Script());
  const std::vector<std::string> texts{"DDPREPL3 header", std::string(kMaxRecordBytes, 'w'),
                                       "the last record"};
  const std::string wire = SealAll(k.client_to_server, texts);
  CHECK(wire.size() ==
        3 * (kRecordHeaderBytes + kTagBytes) + texts[0].size() + texts[1].size() + texts[2].size());
  CHECK(wire.find("DDPREPL3") == std::string::npos);
  CHECK(wire.find("wwwwwwww") == std::string::npos);
  auto back = OpenAll(k.client_to_server, wire);
  REQUIRE(back.ok());
  CHECK(*back == texts);
  // The same plaintexts sealed twice under one key differ record by record
  // (the nonce counts), so equal records do not show.
  const std::string twice = SealAll(k.client_to_server, {"same", "same"});
  CHECK(twice.substr(0, twice.size() / 2) != twice.substr(twice.size() / 2));

  SECTION("a bit flipped in a record's data, tag or length") {
    for (std::size_t at :
         {std::size_t{1}, kRecordHeaderBytes + 3, kRecordHeaderBytes + texts[0].size() + 2}) {
      std::string bad = wire;
      bad[at] ^= 0x01;
      auto got = OpenAll(k.client_to_server, bad);
      CHECK_FALSE(got.ok());
    }
  }
  SECTION("the other direction's key, or another connection's") {
    CHECK(absl::IsDataLoss(OpenAll(k.server_to_client, wire).status()));
    Transcript t = Script();
    t.client_nonce = "client nonce 16X";
    const ChannelKeys other =
        DeriveChannelKeys("tok", "job1", std::string(kSharedSecretBytes, 's'), t);
    CHECK(absl::IsDataLoss(OpenAll(other.client_to_server, wire).status()));
  }
  SECTION("a record replayed, or records reordered") {
    const std::size_t first = kRecordHeaderBytes + texts[0].size() + kTagBytes;
    CHECK(absl::IsDataLoss(
        OpenAll(k.client_to_server, wire.substr(0, first) + wire.substr(0, first)).status()));
    CHECK(absl::IsDataLoss(OpenAll(k.client_to_server, wire.substr(first)).status()));
  }
  SECTION("a length this channel never sends is refused before it is read") {
    std::string bad = wire;
    const std::uint32_t huge = kMaxRecordBytes + 1;
    std::memcpy(bad.data(), &huge, 4);
    CHECK(absl::IsInvalidArgument(OpenAll(k.client_to_server, bad).status()));
  }
}

// Run by LoadLineIn in a fresh process: LoadCipherLibrary's answer.
TEST_CASE("replica cipher child: LoadCipherLibrary's line", "[.][replica_child]") {
  const absl::Status st = LoadCipherLibrary();
  std::printf("LINE:%s\n", st.ok() ? "ok" : std::string(st.message()).c_str());
}

// LoadCipherLibrary's answer in a fresh process (this program, the hidden
// case above) with `file` as the library: the answer is per process.
std::string LoadLineIn(const char* file) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv(kEnvTestCryptoLibrary, file, 1);
    ::dup2(fds[1], STDOUT_FILENO);
    ::execl("/proc/self/exe", "unit_agent_tests", "[replica_child]", nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, r);
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  const std::size_t at = out.find("LINE:");
  REQUIRE(at != std::string::npos);
  return out.substr(at + 5, out.find('\n', at) - at - 5);
}

TEST_CASE("replica cipher: without libcrypto, one line names the library and the fix",
          "[unit][replica][security]") {
  const std::string none = LoadLineIn("libcrypto-not-here.so.3");
  CHECK(none.rfind("--ckpt_encrypt: cannot load libcrypto-not-here.so.3 (", 0) == 0);
  CHECK(none.find("install OpenSSL 3's library (Debian and Ubuntu: libssl3) on this node, or run "
                  "the job with --ckpt_encrypt 0") != std::string::npos);
  CHECK(none.find('\n') == std::string::npos);
  // A library that loads but is not OpenSSL 3 (libz: no EVP functions).
  const std::string other = LoadLineIn("libz.so.1");
  CHECK(other.rfind("--ckpt_encrypt: libz.so.1 has no EVP_CIPHER_CTX_new (not OpenSSL 3); ", 0) ==
        0);
  CHECK(LoadLineIn("libcrypto.so.3") == "ok");
}

}  // namespace
}  // namespace ddprun::agent::replica
