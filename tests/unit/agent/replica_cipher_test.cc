// The replica channel's encryption (replica_cipher.h), no sockets: AES-256-GCM
// against the GCM specification's test cases (McGrew and Viega, the NIST
// submission: cases 15 and 16), HKDF-SHA256 against RFC 5869, and the
// record layer: a record altered, replayed, reordered or opened under
// another key fails its tag.
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
  const ChannelKeys k = DeriveChannelKeys("tok", "job1", "server nonce 16b", "client nonce 16b");
  CHECK(k.client_to_server.size() == kKeyBytes);
  CHECK(k.server_to_client.size() == kKeyBytes);
  CHECK(k.client_to_server != k.server_to_client);
  // Another token, job or nonce: other keys.
  for (const ChannelKeys& o :
       {DeriveChannelKeys("tok2", "job1", "server nonce 16b", "client nonce 16b"),
        DeriveChannelKeys("tok", "job2", "server nonce 16b", "client nonce 16b"),
        DeriveChannelKeys("tok", "job1", "server nonce 16c", "client nonce 16b"),
        DeriveChannelKeys("tok", "job1", "server nonce 16b", "client nonce 16c")}) {
    CHECK(o.client_to_server != k.client_to_server);
    CHECK(o.server_to_client != k.server_to_client);
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
  const ChannelKeys k = DeriveChannelKeys("tok", "job1", "server nonce 16b", "client nonce 16b");
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
    const ChannelKeys other =
        DeriveChannelKeys("tok", "job1", "server nonce 16b", "client nonce 16X");
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
