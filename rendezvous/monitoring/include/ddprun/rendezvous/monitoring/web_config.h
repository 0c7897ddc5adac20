// The monitoring port's web configuration file (`--web_config FILE`), in the
// Prometheus exporter toolkit's format (docs/security.md), so that one file
// serves ddprun and every exporter next to it:
//
//   tls_server_config:
//     cert_file: server.pem          # paths relative to this file's folder
//     key_file: server.key
//     client_ca_file: ca.pem         # with a client_auth_type that verifies
//     client_auth_type: RequireAndVerifyClientCert
//     min_version: TLS12             # TLS10..TLS13; default TLS12
//     max_version: TLS13
//   http_server_config:
//     http2: false                   # accepted; the port speaks HTTP/1.1
//   basic_auth_users:
//     prometheus: $2b$10$...         # bcrypt ($2a$, $2b$, $2y$)
//
// Contract: a problem is ONE line of kind kBadInput (InvalidArgument) that
// names the file, the key and the fix; keys the toolkit knows that ddprun
// does not implement are named as such, never ignored.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

// tls.ClientAuthType, by the toolkit's names.
enum class ClientAuth {
  kNone,              // NoClientCert (default)
  kRequest,           // RequestClientCert: asked for, not required nor verified
  kRequireAny,        // RequireAnyClientCert: required, not verified
  kVerifyIfGiven,     // VerifyClientCertIfGiven
  kRequireAndVerify,  // RequireAndVerifyClientCert
};

// TLS protocol versions as OpenSSL numbers them (TLS1_2_VERSION = 0x0303).
inline constexpr int kTls10 = 0x0301, kTls11 = 0x0302, kTls12 = 0x0303, kTls13 = 0x0304;

struct WebConfig {
  // tls_server_config; cert_file empty: plain HTTP. Paths are absolute
  // (relative ones resolved against the file's folder).
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  ClientAuth client_auth = ClientAuth::kNone;
  int min_version = kTls12;
  int max_version = 0;  // 0: the newest OpenSSL has
  // basic_auth_users: user -> bcrypt hash. Empty: no authentication.
  std::map<std::string, std::string> users;

  bool tls() const { return !cert_file.empty(); }
};

// Parses the YAML text of a web configuration read from `file` (relative
// paths are resolved against its folder); `source` is how the user named it
// ("--web_config", "DDPRUND_WEB_CONFIG", "PET_WEB_CONFIG"). Messages start
// "<source> <file>: ". An empty document is valid (plain HTTP, no
// authentication), as the toolkit's.
absl::StatusOr<WebConfig> ParseWebConfig(const std::string& text, const std::string& file,
                                         const std::string& source = "--web_config");

// Reads `file` and parses it.
absl::StatusOr<WebConfig> ReadWebConfig(const std::string& file,
                                        const std::string& source = "--web_config");

// The value that chooses plain HTTP on purpose next to a TLS gRPC port
// (`--web_config=plaintext`; docs/security.md).
inline constexpr char kWebConfigPlaintext[] = "plaintext";

}  // namespace ddprun::rendezvous
