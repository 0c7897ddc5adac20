#include "ddprun/rendezvous/tls_refusal_log.h"

#include <grpc/support/log.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {
namespace {

// The file gRPC 1.51 logs a failed TLS handshake from.
constexpr const char* kHandshakeLogFile = "ssl_transport_security.cc";

bool EndsWith(const char* s, const char* suffix) {
  const size_t n = std::strlen(s), m = std::strlen(suffix);
  return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

struct Armed {
  std::mutex mu;
  std::unique_ptr<RefusalLimiter> limiter;  // null until armed
};

Armed& State() {
  static Armed* armed = new Armed;  // never destroyed: gRPC may log at exit
  return *armed;
}

}  // namespace

std::optional<TlsRefusal> ClassifyGrpcLogLine(const char* file, int severity, const char* message,
                                              std::string* reason) {
  if (severity != GPR_LOG_SEVERITY_ERROR || file == nullptr || message == nullptr ||
      !EndsWith(file, kHandshakeLogFile)) {
    return std::nullopt;
  }
  // OpenSSL's canonical form: "error:0A000086:SSL routines::...".
  const char* at = std::strstr(message, "error:");
  if (at == nullptr) return std::nullopt;
  char* end = nullptr;
  const unsigned long code = std::strtoul(at + 6, &end, 16);
  if (end != at + 14 || *end != ':') return std::nullopt;
  switch (ERR_GET_REASON(code)) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_UNKNOWN_PROTOCOL:
      return TlsRefusal::kPlaintextClient;
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
      return TlsRefusal::kNoClientCert;
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
      return TlsRefusal::kUntrustedClient;
    default: {
      const char* text = ERR_reason_error_string(code);
      if (reason) *reason = text ? text : absl::StrCat("OpenSSL error ", code);
      return TlsRefusal::kOther;
    }
  }
}

RefusalLimiter::RefusalLimiter(std::string prefix, std::string client_ca_flag)
    : prefix_(std::move(prefix)), client_ca_flag_(std::move(client_ca_flag)) {}

std::string RefusalLimiter::Line(TlsRefusal kind, const std::string& reason) const {
  switch (kind) {
    case TlsRefusal::kPlaintextClient:
      return "refused a client that does not speak TLS; give it --tls_ca (PET_TLS_CA; "
             "DDPRUN_TLS_CA for workers)";
    case TlsRefusal::kNoClientCert:
      return absl::StrCat("refused a TLS client without a certificate (", client_ca_flag_,
                          " requires one); give it --tls_cert and --tls_key");
    case TlsRefusal::kUntrustedClient:
      return absl::StrCat("refused a TLS client whose certificate is not signed by ",
                          client_ca_flag_, "; give it a --tls_cert signed by that CA");
    case TlsRefusal::kOther:
      return absl::StrCat("refused a TLS client: ", reason, "; see docs/tls.md");
  }
  return "refused a TLS client";
}

std::optional<std::string> RefusalLimiter::Note(TlsRefusal kind, const std::string& reason,
                                                TimePoint now) {
  Slot& slot = slots_[kind];
  if (slot.printed && now - slot.last < kRefusalLogInterval) {
    ++slot.held;
    return std::nullopt;
  }
  std::string line = absl::StrCat(prefix_, Line(kind, reason));
  if (slot.held > 0) {
    absl::StrAppend(&line, " (and ", slot.held, " more like it in the last ",
                    std::chrono::duration_cast<std::chrono::seconds>(now - slot.last).count(),
                    " s)");
  }
  slot.printed = true;
  slot.last = now;
  slot.held = 0;
  return line;
}

void ArmTlsRefusalLog(const std::string& prefix, const std::string& client_ca_flag) {
  Armed& a = State();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.limiter) return;
  a.limiter = std::make_unique<RefusalLimiter>(prefix, client_ca_flag);
  // ddprund starts with GRPC_VERBOSITY=NONE; the handshake lines are ERRORs.
  const char* v = std::getenv("DDPRUN_GRPC_LOG");
  if (!v || std::string(v) != "1") gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
}

void NoteGrpcLogLine(const char* file, int severity, const char* message) {
  std::string reason;
  const std::optional<TlsRefusal> kind = ClassifyGrpcLogLine(file, severity, message, &reason);
  if (!kind) return;
  Armed& a = State();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!a.limiter) return;
  if (auto line = a.limiter->Note(*kind, reason, std::chrono::steady_clock::now())) {
    line->push_back('\n');
    std::fputs(line->c_str(), stderr);
    std::fflush(stderr);
  }
}

}  // namespace ddprun::rendezvous
