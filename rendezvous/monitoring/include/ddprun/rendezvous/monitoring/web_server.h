// The monitoring port with its web configuration applied (docs/security.md):
// HTTPS (OpenSSL, through Boost.Asio) and basic authentication (bcrypt,
// libcrypt's crypt_rn), in library ddprun_rendezvous_monitoring_tls. ddprund
// links it; bin/ddprun reaches it through its gRPC module, so that a job
// without a web configuration loads no OpenSSL.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/web_config.h"

namespace ddprun::rendezvous {

// What the port enforces, files read and checked. Default: plain HTTP, no
// authentication.
struct WebSecurity {
  TlsConfig tls;  // enabled: HTTPS with cert_pem/key_pem; client_ca_pem verifies clients
  ClientAuth client_auth = ClientAuth::kNone;
  int min_version = kTls12;
  int max_version = 0;
  std::map<std::string, std::string> users;  // user -> bcrypt hash; empty: no auth
  // Where it came from, for the serving line: "--web_config /etc/w.yml",
  // "--tls_cert (as the gRPC port)".
  std::string origin;
};

// Reads and checks the PEM files a WebConfig names (LoadServerTls's checks,
// messages naming "<source> <file>: tls_server_config.cert_file").
absl::StatusOr<WebSecurity> LoadWebSecurity(const WebConfig& config, const std::string& file,
                                            const std::string& source = "--web_config");

// The monitoring port as the gRPC port's TLS configures it, when no web
// configuration is given: the same certificate, and its client CA verifying
// clients (RequireAndVerifyClientCert) when the gRPC port has one.
WebSecurity WebSecurityFromGrpcTls(const TlsConfig& grpc_tls);

// One line for the log: what the port serves ("HTTPS with mutual TLS and
// basic auth (2 users), from --web_config /etc/w.yml").
std::string DescribeWebSecurity(const WebSecurity& security);

// Checks a basic-auth Authorization header against bcrypt hashes. Verified
// credentials are remembered (as a SHA-256 of user, hash and password, at
// most 256 of them) so that a scraper's every request does not pay bcrypt's
// cost; an unknown user costs what a known one does. Thread-safe.
class BasicAuth {
 public:
  explicit BasicAuth(std::map<std::string, std::string> users);
  ~BasicAuth();
  bool Check(std::string_view authorization);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Starts the monitoring port with `security` applied: HTTPS when
// security.tls.enabled, basic auth when it has users. The options' own
// authorize is replaced. Errors as HttpServer::Start's; a certificate
// OpenSSL refuses: InvalidArgument naming security.origin.
absl::StatusOr<std::unique_ptr<HttpServer>> StartMonitoringServer(HttpServerOptions options,
                                                                  const WebSecurity& security,
                                                                  HttpHandler handler);

// The refusal log of a monitoring port: one line on stderr per kind at most
// every `interval`, "<prefix>monitoring port: <what>" with the count of those
// held back since the last line. Never a credential.
HttpRefusalLog MakeRefusalLog(std::string prefix, Duration interval = std::chrono::seconds(1));

}  // namespace ddprun::rendezvous
