// The monitoring port's web configuration (web_config.h): the exporter
// toolkit's format parsed, every bad input one line naming the file, the
// line, the key and the fix; and bcrypt basic auth (web_server.h).
#include "ddprun/rendezvous/monitoring/web_config.h"

#include <crypt.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/monitoring/web_server.h"

namespace ddprun::rendezvous {
namespace {

std::string Err(const std::string& yaml) {
  auto c = ParseWebConfig(yaml, "/etc/ddprun/web.yml");
  REQUIRE_FALSE(c.ok());
  CHECK(KindOf(c.status()) == ErrorKind::kBadInput);
  const std::string m(c.status().message());
  // One line, naming the file, with a fix after "; ".
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.rfind("--web_config /etc/ddprun/web.yml: ", 0) == 0);
  CHECK(m.find("; ") != std::string::npos);
  return m;
}

// A bcrypt hash of `password` (cost 4: fast).
std::string Bcrypt(const std::string& password) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  REQUIRE(crypt_gensalt_rn("$2b$", 4, nullptr, 0, salt, sizeof(salt)) != nullptr);
  crypt_data data{};
  const char* h = crypt_rn(password.c_str(), salt, &data, sizeof(data));
  REQUIRE(h != nullptr);
  REQUIRE(h[0] == '$');
  return h;
}

std::string Basic(const std::string& user_password) {
  return "Basic " + absl::Base64Escape(user_password);
}

const std::string kHash = "$2b$04$abcdefghijklmnopqrstuuR0bK8b1O4Pd5G3J8m0e9vJ7Yv0lJdFa";

TEST_CASE("web config: the exporter toolkit's keys", "[unit]") {
  auto c = ParseWebConfig(
      "tls_server_config:\n"
      "  cert_file: server.pem\n"
      "  key_file: /abs/server.key\n"
      "  client_ca_file: ca.pem\n"
      "  client_auth_type: RequireAndVerifyClientCert\n"
      "  min_version: TLS13\n"
      "  max_version: TLS13\n"
      "http_server_config:\n"
      "  http2: false\n"
      "basic_auth_users:\n"
      "  prometheus: " +
          kHash + "\n",
      "/etc/ddprun/web.yml");
  INFO(c.status().message());
  REQUIRE(c.ok());
  CHECK(c->tls());
  CHECK(c->cert_file == "/etc/ddprun/server.pem");  // relative to the file's folder
  CHECK(c->key_file == "/abs/server.key");
  CHECK(c->client_ca_file == "/etc/ddprun/ca.pem");
  CHECK(c->client_auth == ClientAuth::kRequireAndVerify);
  CHECK(c->min_version == kTls13);
  CHECK(c->max_version == kTls13);
  CHECK(c->users.at("prometheus") == kHash);

  // Empty and comment-only files: plain HTTP, no authentication.
  for (const char* empty : {"", "# nothing\n", "tls_server_config:\nbasic_auth_users:\n"}) {
    auto e = ParseWebConfig(empty, "w.yml");
    REQUIRE(e.ok());
    CHECK_FALSE(e->tls());
    CHECK(e->users.empty());
    CHECK(e->min_version == kTls12);
  }
  // Basic auth alone, and a relative file name resolved against ".".
  auto a = ParseWebConfig("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n", "w.yml");
  REQUIRE(a.ok());
  CHECK(a->cert_file == "./c.pem");
}

TEST_CASE("web config: every bad input is one line naming the key and the fix", "[unit]") {
  CHECK(Err("tls_server_confg:\n  cert_file: a\n") ==
        "--web_config /etc/ddprun/web.yml: line 1: unknown key 'tls_server_confg' under the top "
        "level (did you mean tls_server_config?); the keys there are tls_server_config, "
        "http_server_config, basic_auth_users");
  CHECK_THAT(Err("tls_server_config:\n  cert_file: a\n  key_file: b\n  keyfile: c\n"),
             Catch::Contains("line 4: unknown key 'keyfile' under tls_server_config"));
  // Keys of the toolkit that ddprun does not implement are named, not ignored.
  CHECK_THAT(
      Err("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n"),
      Catch::Contains("'cipher_suites' (under tls_server_config) is not supported by ddprun"));
  CHECK_THAT(Err("http_server_config:\n  headers:\n    X-A: b\n"),
             Catch::Contains("'headers' (under http_server_config) is not supported"));
  CHECK_THAT(Err("http_server_config:\n  http2: maybe\n"),
             Catch::Contains("http2 is not true or false"));
  CHECK_THAT(Err("[1, 2]\n"), Catch::Contains("the document is not a mapping"));
  CHECK_THAT(Err("tls_server_config: [a]\n"),
             Catch::Contains("tls_server_config is not a mapping"));
  CHECK_THAT(Err("tls_server_config: {\n"), Catch::Contains("not YAML"));
  CHECK_THAT(Err("tls_server_config:\n  key_file: k\n"),
             Catch::Contains("tls_server_config has no cert_file"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n"),
             Catch::Contains("tls_server_config has no key_file"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: ''\n  key_file: k\n"),
             Catch::Contains("cert_file is not a non-empty string"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: [c]\n  key_file: k\n"),
             Catch::Contains("cert_file is not a non-empty string"));
  CHECK_THAT(
      Err("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: "
          "RequireAndVerify\n"),
      Catch::Contains("client_auth_type 'RequireAndVerify' is not a client auth type (did you mean "
                      "RequireAndVerifyClientCert?)"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n  key_file: k\n"
                 "  client_auth_type: RequireAndVerifyClientCert\n"),
             Catch::Contains("client_ca_file is missing"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n  key_file: k\n"
                 "  client_auth_type: VerifyClientCertIfGiven\n"),
             Catch::Contains("client_ca_file is missing"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n  key_file: k\n  client_ca_file: ca\n"),
             Catch::Contains("client_ca_file is given without a client_auth_type"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS1.2\n"),
             Catch::Contains("min_version 'TLS1.2' is not a TLS version; write one of TLS10, "
                             "TLS11, TLS12, TLS13"));
  CHECK_THAT(Err("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS13\n"
                 "  max_version: TLS12\n"),
             Catch::Contains("max_version is older than min_version"));
  CHECK_THAT(Err("basic_auth_users: [a]\n"), Catch::Contains("basic_auth_users is not a mapping"));
  // A password written in the clear is refused, and never repeated.
  const std::string clear = Err("basic_auth_users:\n  prometheus: hunter2-secret\n");
  CHECK_THAT(clear, Catch::Contains("line 2: the password of basic_auth_users 'prometheus' is "
                                    "not a bcrypt hash"));
  CHECK(clear.find("hunter2") == std::string::npos);
  CHECK_THAT(Err("basic_auth_users:\n  prometheus: $1$abc$defghijklmnop\n"),
             Catch::Contains("not a bcrypt hash"));
  CHECK_THAT(Err("basic_auth_users:\n  \"a:b\": " + kHash + "\n"),
             Catch::Contains("empty or holds ':'"));
}

TEST_CASE("web config: files that cannot be read are one line", "[unit]") {
  auto missing = ReadWebConfig("/nonexistent/web.yml", "DDPRUND_WEB_CONFIG");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() ==
        "DDPRUND_WEB_CONFIG /nonexistent/web.yml: cannot read: No such file or directory; check "
        "the path and that this user can read it");
  auto dir = ReadWebConfig("/tmp");
  REQUIRE_FALSE(dir.ok());
  CHECK_THAT(std::string(dir.status().message()), Catch::Contains("not a regular file"));
}

TEST_CASE("basic auth: bcrypt hashes, wrong and malformed credentials", "[unit]") {
  BasicAuth auth({{"prometheus", Bcrypt("s3cret")}, {"alice", Bcrypt("other")}});
  CHECK(auth.Check(Basic("prometheus:s3cret")));
  CHECK(auth.Check(Basic("prometheus:s3cret")));  // remembered: same answer
  CHECK(auth.Check("basic " + absl::Base64Escape("alice:other")));
  CHECK(auth.Check(Basic("alice:other")));
  CHECK_FALSE(auth.Check(Basic("prometheus:other")));  // another user's password
  CHECK_FALSE(auth.Check(Basic("prometheus:s3cre")));
  CHECK_FALSE(auth.Check(Basic("prometheus:s3cret ")));
  CHECK_FALSE(auth.Check(Basic("nobody:s3cret")));
  CHECK_FALSE(auth.Check(Basic("prometheus")));  // no colon
  CHECK_FALSE(auth.Check(""));
  CHECK_FALSE(auth.Check("Basic "));
  CHECK_FALSE(auth.Check("Basic !!!not-base64"));
  CHECK_FALSE(auth.Check("Bearer " + absl::Base64Escape("prometheus:s3cret")));
  CHECK_FALSE(auth.Check("Basic " + std::string(10000, 'A')));
  CHECK_FALSE(auth.Check(Basic(std::string("prometheus:s3cret\0x", 19))));
}

TEST_CASE("web security: what the port serves is said in one line", "[unit]") {
  WebSecurity s;
  CHECK(DescribeWebSecurity(s) == "plain HTTP");
  s.users = {{"a", kHash}};
  s.origin = "--web_config w.yml";
  CHECK(DescribeWebSecurity(s) == "plain HTTP with basic auth (1 user), from --web_config w.yml");
  TlsConfig grpc;
  grpc.enabled = true;
  grpc.client_ca_pem = "x";
  WebSecurity g = WebSecurityFromGrpcTls(grpc);
  CHECK(g.client_auth == ClientAuth::kRequireAndVerify);
  CHECK(DescribeWebSecurity(g) == "HTTPS with mutual TLS, from --tls_cert (as the gRPC port)");
  grpc.client_ca_pem.clear();
  CHECK(WebSecurityFromGrpcTls(grpc).client_auth == ClientAuth::kNone);
}

}  // namespace
}  // namespace ddprun::rendezvous
