// The monitoring port with its web configuration (web_server.h): TLS
// sessions over http_server_impl.h's loop, bcrypt basic auth, the refusal log.
#include "ddprun/rendezvous/monitoring/web_server.h"

#include <crypt.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <iostream>
#include <mutex>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "http_server_impl.h"

namespace ddprun::rendezvous {
namespace {

namespace ssl = boost::asio::ssl;
using TlsStream = http_impl::beast::ssl_stream<http_impl::beast::tcp_stream>;
using TlsSession = http_impl::Session<TlsStream>;

// Verifies a certificate only as the client auth type asks: RequestClientCert
// and RequireAnyClientCert take any certificate (the toolkit's meaning).
int AcceptAny(int, X509_STORE_CTX*) { return 1; }

absl::StatusOr<std::shared_ptr<ssl::context>> MakeContext(const WebSecurity& s) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* native = ctx->native_handle();
  boost::system::error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::single_dh_use);
  ctx->use_certificate_chain(boost::asio::buffer(s.tls.cert_pem), ec);
  if (!ec) ctx->use_private_key(boost::asio::buffer(s.tls.key_pem), ssl::context::pem, ec);
  if (!ec && !s.tls.client_ca_pem.empty()) {
    ctx->add_certificate_authority(boost::asio::buffer(s.tls.client_ca_pem), ec);
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.origin, ": OpenSSL refuses the certificate, key or CA (", ec.message(),
                     "); give PEM files that `openssl x509 -noout -in FILE` reads"));
  }
  if (SSL_CTX_set_min_proto_version(native, s.min_version) != 1 ||
      (s.max_version != 0 && SSL_CTX_set_max_proto_version(native, s.max_version) != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.origin,
                     ": this OpenSSL cannot serve the TLS versions asked for; write min_version: "
                     "TLS12"));
  }
  switch (s.client_auth) {
    case ClientAuth::kNone:
      ctx->set_verify_mode(ssl::verify_none);
      break;
    case ClientAuth::kRequest:
      SSL_CTX_set_verify(native, SSL_VERIFY_PEER, AcceptAny);
      break;
    case ClientAuth::kRequireAny:
      SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, AcceptAny);
      break;
    case ClientAuth::kVerifyIfGiven:
      ctx->set_verify_mode(ssl::verify_peer);
      break;
    case ClientAuth::kRequireAndVerify:
      ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
      break;
  }
  return ctx;
}

// A handshake's failure as one short reason (OpenSSL's reason string; never
// anything the peer sent).
std::string HandshakeReason(const boost::system::error_code& ec) {
  if (ec == boost::asio::error::eof || ec == ssl::error::stream_truncated) {
    return "the client closed the connection during the handshake";
  }
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    if (const char* r = ERR_reason_error_string(static_cast<unsigned long>(ec.value()))) {
      return r;
    }
  }
  return ec.message();
}

}  // namespace

absl::StatusOr<WebSecurity> LoadWebSecurity(const WebConfig& config, const std::string& file,
                                            const std::string& source) {
  WebSecurity s;
  s.origin = absl::StrCat(source, " ", file);
  s.client_auth = config.client_auth;
  s.min_version = config.min_version;
  s.max_version = config.max_version;
  s.users = config.users;
  if (config.tls()) {
    TlsOptions o;
    o.cert_file = config.cert_file;
    o.key_file = config.key_file;
    o.client_ca_file = config.client_ca_file;
    o.names.cert = absl::StrCat(s.origin, ": tls_server_config.cert_file");
    o.names.key = absl::StrCat(s.origin, ": tls_server_config.key_file");
    o.names.client_ca = absl::StrCat(s.origin, ": tls_server_config.client_ca_file");
    auto tls = LoadServerTls(o);
    if (!tls.ok()) return tls.status();
    s.tls = *std::move(tls);
  }
  return s;
}

WebSecurity WebSecurityFromGrpcTls(const TlsConfig& grpc_tls) {
  WebSecurity s;
  s.tls = grpc_tls;
  s.client_auth =
      grpc_tls.client_ca_pem.empty() ? ClientAuth::kNone : ClientAuth::kRequireAndVerify;
  s.origin = "--tls_cert (as the gRPC port)";
  return s;
}

std::string DescribeWebSecurity(const WebSecurity& s) {
  std::string what = s.tls.enabled ? "HTTPS" : "plain HTTP";
  if (s.tls.enabled && (s.client_auth == ClientAuth::kRequireAndVerify ||
                        s.client_auth == ClientAuth::kRequireAny)) {
    absl::StrAppend(&what, " with mutual TLS");
  }
  if (!s.users.empty()) {
    absl::StrAppend(&what, s.tls.enabled && s.client_auth != ClientAuth::kNone ? " and" : " with",
                    " basic auth (", s.users.size(), s.users.size() == 1 ? " user)" : " users)");
  }
  if (!s.origin.empty()) absl::StrAppend(&what, ", from ", s.origin);
  return what;
}

// ---- basic auth ----

// bcrypt (cost 10) of a password nobody knows: what an unknown user is
// checked against.
const std::string kNoUserHash = "$2b$10$Oee990V7OvK2kRHEbpSjOONDH6lFodxtbUnyWC7wfd6o1uiYvEF1i";

class BasicAuth::Impl {
 public:
  explicit Impl(std::map<std::string, std::string> users) : users_(std::move(users)) {}

  bool Check(std::string_view header) {
    std::string user, password;
    if (!Decode(header, user, password)) return false;
    auto it = users_.find(user);
    // An unknown user is checked against a hash of its own, so that its
    // answer takes as long as a known user's.
    const std::string& hash = it != users_.end() ? it->second : kNoUserHash;
    const std::string key = Key(user, hash, password);
    std::lock_guard<std::mutex> lock(mu_);
    if (it != users_.end() && verified_.count(key) != 0) return true;
    const char* out = crypt_rn(password.c_str(), hash.c_str(), &data_, sizeof(data_));
    const bool ok = it != users_.end() && out != nullptr && out[0] != '*' &&
                    CRYPTO_memcmp(out, hash.c_str(), hash.size() + 1) == 0;
    if (ok) {
      if (verified_.size() >= 256) verified_.clear();
      verified_.insert(key);
    }
    return ok;
  }

 private:
  static bool Decode(std::string_view header, std::string& user, std::string& password) {
    constexpr std::string_view kBasic = "Basic ";
    if (header.size() <= kBasic.size() || header.size() > 4096 ||
        !absl::EqualsIgnoreCase(absl::string_view(header.data(), kBasic.size()),
                                absl::string_view(kBasic.data(), kBasic.size()))) {
      return false;
    }
    const std::string_view encoded = header.substr(kBasic.size());
    std::string plain;
    if (!absl::Base64Unescape(absl::string_view(encoded.data(), encoded.size()), &plain)) {
      return false;
    }
    const auto colon = plain.find(':');
    if (colon == std::string::npos || plain.find('\0') != std::string::npos) return false;
    user = plain.substr(0, colon);
    password = plain.substr(colon + 1);
    return true;
  }

  static std::string Key(const std::string& user, const std::string& hash,
                         const std::string& password) {
    const std::string all =
        absl::StrCat(user, std::string(1, '\0'), hash, std::string(1, '\0'), password);
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(all.data()), all.size(), digest);
    return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
  }

  const std::map<std::string, std::string> users_;
  std::mutex mu_;
  crypt_data data_{};
  std::set<std::string> verified_;
};

BasicAuth::BasicAuth(std::map<std::string, std::string> users)
    : impl_(std::make_unique<Impl>(std::move(users))) {}
BasicAuth::~BasicAuth() = default;
bool BasicAuth::Check(std::string_view authorization) { return impl_->Check(authorization); }

// ---- the server ----

absl::StatusOr<std::unique_ptr<HttpServer>> StartMonitoringServer(HttpServerOptions options,
                                                                  const WebSecurity& security,
                                                                  HttpHandler handler) {
  options.authorize = nullptr;
  if (!security.users.empty()) {
    auto auth = std::make_shared<BasicAuth>(security.users);
    options.authorize = [auth](std::string_view header) { return auth->Check(header); };
  }
  if (!security.tls.enabled) return HttpServer::Start(options, std::move(handler));
  auto ctx = MakeContext(security);
  if (!ctx.ok()) return ctx.status();
  auto impl = std::make_unique<HttpServer::Impl>(
      options, std::move(handler),
      [ctx = *ctx](HttpServer::Impl* server, http_impl::tcp::socket socket) {
        auto session = std::make_shared<TlsSession>(server, std::move(socket), *ctx);
        // The handshake has the request's deadline: a client that connects
        // and never speaks is dropped after read_timeout.
        session->tcp().expires_after(server->options().read_timeout);
        session->stream().async_handshake(
            ssl::stream_base::server, [session](boost::system::error_code ec) {
              if (ec) {
                session->server().Refused(ec == http_impl::beast::error::timeout
                                              ? HttpRefusal::kTimeout
                                              : HttpRefusal::kTlsHandshake,
                                          HandshakeReason(ec));
                session->Close();
                return;
              }
              session->Read();
            });
      });
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return HttpServer::Adopt(std::move(impl));
}

// ---- the refusal log ----

HttpRefusalLog MakeRefusalLog(std::string prefix, Duration interval) {
  struct Slot {
    TimePoint last{};
    bool printed = false;
    std::int64_t held = 0;
  };
  struct State {
    std::mutex mu;
    std::map<HttpRefusal, Slot> slots;
  };
  auto state = std::make_shared<State>();
  return
      [state, prefix = std::move(prefix), interval](HttpRefusal kind, const std::string& detail) {
        const TimePoint now = std::chrono::steady_clock::now();
        std::string line;
        {
          std::lock_guard<std::mutex> lock(state->mu);
          Slot& slot = state->slots[kind];
          if (slot.printed && now - slot.last < interval) {
            ++slot.held;
            return;
          }
          switch (kind) {
            case HttpRefusal::kOverLimit:
              line = "a connection over the connection limit was closed at accept";
              break;
            case HttpRefusal::kBadCredentials:
              line = "refused a request with wrong basic-auth credentials (401)";
              break;
            case HttpRefusal::kTlsHandshake:
              line = absl::StrCat("refused a TLS handshake: ", detail);
              break;
            case HttpRefusal::kTimeout:
              line = "dropped a client that sent no request within the read deadline";
              break;
            case HttpRefusal::kNotHttp:
              line = absl::StrCat("dropped a client that did not speak HTTP (", detail, ")");
              break;
          }
          if (slot.held > 0) absl::StrAppend(&line, " (and ", slot.held, " more like it since)");
          slot.printed = true;
          slot.last = now;
          slot.held = 0;
        }
        std::cerr << prefix << "monitoring port: " << line << std::endl;
      };
}

}  // namespace ddprun::rendezvous
