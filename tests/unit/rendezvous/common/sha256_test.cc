// The self-contained SHA-256 (rendezvous/common/src/sha256.cc; `ddprun check`)
// against FIPS 180-4's examples, the million-'a' vector, every padding edge
// (55/56/63/64/65/119/120 bytes; digests from Python's hashlib) and the same
// bytes fed in uneven pieces.
#include "ddprun/rendezvous/common/sha256.h"

#include <catch2/catch.hpp>
#include <string>

using ddprun::rendezvous::Sha256;
using ddprun::rendezvous::Sha256Hex;

TEST_CASE("Sha256: FIPS 180-4 examples", "[sha256]") {
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(Sha256Hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("Sha256: every padding edge", "[sha256]") {
  const std::pair<int, const char*> cases[] = {
      {55, "85528b5baff5639cb8e7daca79d085ac29ac0978e873ed7527158616b2b6c379"},
      {56, "f8ce2f8d6990c639668fe404262f35ed72d8bb145ad6bae786af7284447386df"},
      {63, "9b49777003a4143d8c3f4d3002eb631c6bda8b030a3ccc87f8a21d5f61c89e87"},
      {64, "ee8e658590c9a5e119400a774415a01db104de1ee6e2c29ec69aa73ef46544d2"},
      {65, "2b6c3f7f12b1b12fc5409626dc4e5302d8d37082cbeddea7755eac43aba039c8"},
      {119, "c8bc8a6e9626586bb888ad131d44ed2bd37fc608e902904ade3c566c4208e6ca"},
      {120, "77a2d49d72a11e41678c51f8f0cb67f5cb570f30370c3aeffe266a0d1ee43209"}};
  for (const auto& [n, hex] : cases) {
    INFO(n << " bytes");
    CHECK(Sha256Hex(std::string(n, 'q')) == hex);
  }
}

TEST_CASE("Sha256: pieces of any size give the one-shot digest", "[sha256]") {
  std::string data;
  for (int i = 0; i < 3; ++i) {
    for (int b = 0; b < 256; ++b) data += static_cast<char>(b);
  }
  data += std::string(55, 'x');  // 823 bytes
  const std::string want = "1d099a857037971bbd4c2e0a22e35939ef393d1831523e67d125d194e77ee949";
  REQUIRE(Sha256Hex(data) == want);
  for (std::size_t piece : {1, 3, 63, 64, 65, 200}) {
    INFO("pieces of " << piece);
    Sha256 sha;
    for (std::size_t at = 0; at < data.size(); at += piece) {
      sha.Update(data.data() + at, std::min(piece, data.size() - at));
    }
    CHECK(sha.HexDigest() == want);
  }
}

TEST_CASE("HmacSha256: RFC 4231's test cases 1, 2 and 6", "[sha256]") {
  auto hex = [](const ddprun::rendezvous::Sha256Digest& d) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    for (std::uint8_t v : d) {
      out += kHex[v >> 4];
      out += kHex[v & 15];
    }
    return out;
  };
  using ddprun::rendezvous::HmacSha256;
  CHECK(hex(HmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than the block is hashed first.
  CHECK(hex(HmacSha256(std::string(131, '\xaa'),
                       "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("DigestsEqual compares whole strings", "[sha256]") {
  using ddprun::rendezvous::DigestsEqual;
  CHECK(DigestsEqual("abc", "abc"));
  CHECK_FALSE(DigestsEqual("abc", "abd"));
  CHECK_FALSE(DigestsEqual("abc", "ab"));
  CHECK(DigestsEqual("", ""));
}
