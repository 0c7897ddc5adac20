#include "ddprun/rendezvous/tls_probe.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"

namespace ddprun::rendezvous {
namespace {

constexpr Duration kMaxProbe = std::chrono::seconds(2);
// After our side of a TLS 1.3 handshake is done, a server that refuses our
// certificate says so with an alert; this long we wait for its first bytes.
constexpr Duration kMaxAfterHandshake = std::chrono::milliseconds(1500);

// TLS alert descriptions (RFC 8446 6.2) a refusing server sends.
constexpr int kAlertHandshakeFailure = 40;
constexpr int kAlertCertificateRequired = 116;

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};

// What the server sent, seen by OpenSSL's message callback.
struct Seen {
  bool server_hello = false;
  bool cert_request = false;  // the server asked for a client certificate
  int alert = -1;             // the description of the server's fatal alert, or -1
};

void OnMessage(int write_p, int, int content_type, const void* buf, size_t len, SSL*, void* arg) {
  if (write_p != 0 || len < 1) return;
  auto* seen = static_cast<Seen*>(arg);
  const auto* b = static_cast<const unsigned char*>(buf);
  if (content_type == SSL3_RT_HANDSHAKE && b[0] == SSL3_MT_SERVER_HELLO) seen->server_hello = true;
  if (content_type == SSL3_RT_HANDSHAKE && b[0] == SSL3_MT_CERTIFICATE_REQUEST) {
    seen->cert_request = true;
  }
  if (content_type == SSL3_RT_ALERT && len >= 2 && b[0] == SSL3_AL_FATAL) seen->alert = b[1];
}

bool AddPemCerts(const std::string& pem, X509_STORE* store) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  bool any = false;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    any = X509_STORE_add_cert(store, x) == 1 || any;
    X509_free(x);
  }
  ERR_clear_error();
  return any;
}

bool UseCertAndKey(const TlsConfig& tls, SSL* ssl) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(tls.cert_pem.data(), static_cast<int>(tls.cert_pem.size())), BIO_free);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr) return false;
  SSL_use_certificate(ssl, leaf);
  X509_free(leaf);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    SSL_add0_chain_cert(ssl, x);
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> kbio(
      BIO_new_mem_buf(tls.key_pem.data(), static_cast<int>(tls.key_pem.size())), BIO_free);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr);
  const bool ok = key != nullptr && SSL_use_PrivateKey(ssl, key) == 1;
  EVP_PKEY_free(key);
  ERR_clear_error();
  return ok;
}

// Runs a non-blocking OpenSSL call until it completes, fails or the deadline
// passes. Returns its last result; *timed_out when the deadline passed.
template <typename Op>
int RunUntil(SSL* ssl, int fd, TimePoint deadline, Op op, bool* timed_out) {
  *timed_out = false;
  while (true) {
    const int rc = op();
    if (rc > 0) return rc;
    const int err = SSL_get_error(ssl, rc);
    short events = 0;
    if (err == SSL_ERROR_WANT_READ) events = POLLIN;
    if (err == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    if (events == 0) return rc;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *timed_out = true;
      return rc;
    }
    pollfd p{fd, events, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::string AlertName(int alert) { return SSL_alert_desc_string_long(alert); }

// OpenSSL writes to the socket with write(2): a server that already closed
// would kill the process with SIGPIPE. Blocks it in this thread for the
// probe, and discards one that became pending during it.
class BlockSigpipe {
 public:
  BlockSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~BlockSigpipe() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{}, old_{};
  bool was_pending_ = false;
};

}  // namespace

TlsFinding ProbeTls(const std::string& host, int port, const TlsConfig& tls, Duration timeout) {
  const TimePoint deadline = std::chrono::steady_clock::now() + std::min(timeout, kMaxProbe);
  BlockSigpipe no_sigpipe;
  auto addresses = net::ResolveTcp(host, port);
  if (!addresses.ok() || addresses->empty()) return {};
  auto fd = net::ConnectTcp(addresses->front(), deadline);
  if (!fd.ok()) return {};  // nothing listens: not a TLS problem

  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return {};
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  if (tls.enabled) AddPemCerts(tls.ca_pem, SSL_CTX_get_cert_store(ctx.get()));
  // Verification is read afterwards (SSL_get_verify_result), so that a
  // refused certificate is named instead of ending the handshake.
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  Seen seen;
  SSL_CTX_set_msg_callback(ctx.get(), OnMessage);
  SSL_CTX_set_msg_callback_arg(ctx.get(), &seen);
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  if (!ssl) return {};
  SSL_set_fd(ssl.get(), fd->get());
  if (IsIpLiteral(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    X509_VERIFY_PARAM_set1_host(SSL_get0_param(ssl.get()), host.c_str(), 0);
  }
  const bool have_cert = tls.enabled && !tls.cert_pem.empty();
  if (have_cert) UseCertAndKey(tls, ssl.get());

  bool timed_out = false;
  SSL* s = ssl.get();
  int rc = RunUntil(
      s, fd->get(), deadline, [s] { return SSL_connect(s); }, &timed_out);
  ERR_clear_error();
  if (timed_out) return {};
  // Whether the server dropped us during or right after the handshake
  // without a word of HTTP/2 (gRPC does not always send its alert).
  bool dropped = rc <= 0;
  if (rc > 0) {
    // TLS 1.3: the server checks our certificate after our Finished and
    // refuses with an alert. Send the HTTP/2 preface and read its answer.
    static const char kPreface[] =
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    const auto after = std::min(deadline, std::chrono::steady_clock::now() + kMaxAfterHandshake);
    RunUntil(
        s, fd->get(), after, [s] { return SSL_write(s, kPreface, sizeof(kPreface) - 1); },
        &timed_out);
    char buf[64];
    rc = RunUntil(
        s, fd->get(), after, [s, &buf] { return SSL_read(s, buf, sizeof(buf)); }, &timed_out);
    ERR_clear_error();
    dropped = rc <= 0 && !timed_out;
  }

  if (!seen.server_hello) {
    if (!tls.enabled) return {};  // plaintext both: not a TLS problem
    return {TlsProblem::kServerNotTls, ""};
  }
  if (!tls.enabled) return {TlsProblem::kServerRequiresTls, ""};
  const long verify = SSL_get_verify_result(s);
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    return {TlsProblem::kWrongName, ""};
  }
  if (verify != X509_V_OK) return {TlsProblem::kUntrusted, X509_verify_cert_error_string(verify)};
  if (seen.alert >= 0) {
    // We sent no certificate: an alert after the server asked for one (Go's
    // TLS, etcd's, says bad_certificate) means that it requires one.
    if (!have_cert && (seen.alert == kAlertCertificateRequired ||
                       seen.alert == kAlertHandshakeFailure || seen.cert_request)) {
      return {TlsProblem::kClientCertMissing, ""};
    }
    return {TlsProblem::kClientCertRefused, AlertName(seen.alert)};
  }
  if (dropped && seen.cert_request) {
    if (!have_cert) return {TlsProblem::kClientCertMissing, ""};
    return {TlsProblem::kClientCertRefused, ""};
  }
  return {};
}

absl::Status DiagnoseTls(const std::string& host, int port, const TlsConfig& tls,
                         Duration timeout) {
  const TlsFinding found = ProbeTls(host, port, tls, timeout);
  const std::string target = FormatHostPort(host, port);
  switch (found.problem) {
    case TlsProblem::kNone:
      return absl::OkStatus();
    case TlsProblem::kServerNotTls:
      return TlsHandshakeError(
          target, "the server does not speak TLS",
          "start it with --tls_cert and --tls_key, or connect without --tls_ca");
    case TlsProblem::kServerRequiresTls:
      return TlsHandshakeError(
          target, "the server requires TLS and this client connects in plaintext",
          "give --tls_ca (PET_TLS_CA, job file tls_ca; DDPRUN_TLS_CA for workers) with the CA that "
          "signed the server's certificate");
    case TlsProblem::kWrongName:
      return TlsHandshakeError(
          target, absl::StrCat("the server's certificate is not issued for ", host),
          "connect by a name or address in its subjectAltName, or issue it with this one");
    case TlsProblem::kUntrusted:
      return TlsHandshakeError(
          target, absl::StrCat("the server's certificate is not trusted (", found.detail, ")"),
          "check --tls_ca: it must be the CA that signed the server's --tls_cert");
    case TlsProblem::kClientCertMissing:
      return TlsHandshakeError(
          target, "the server requires a client certificate (mutual TLS) and this client has none",
          "give --tls_cert and --tls_key, signed by the CA of the server's --tls_client_ca");
    case TlsProblem::kClientCertRefused:
      return TlsHandshakeError(
          target,
          found.detail.empty()
              ? "the server closed the connection after checking this client's certificate"
              : absl::StrCat("the server refused this client's certificate (", found.detail, ")"),
          "check --tls_cert: it must be signed by the CA of the server's --tls_client_ca");
  }
  return absl::OkStatus();
}

}  // namespace ddprun::rendezvous
