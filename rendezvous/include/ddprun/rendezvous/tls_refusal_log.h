// The server's side of a refused TLS handshake: one line on stderr per kind of
// refusal, at most one per kind every kRefusalLogInterval, with the count of
// those it held back.
//
// gRPC 1.51 reports a failed server handshake only through its own log: an
// ERROR from ssl_transport_security.cc that carries OpenSSL's error code in
// OpenSSL's fixed format "error:%08lX:" (and not the peer's address, which
// gRPC does not expose there). The kind is decided on that code's reason
// (SSL_R_*), not on the prose around it. SilenceGrpcLogging's log function
// passes every gRPC log line here; nothing is printed until a TLS server arms
// the log.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

inline constexpr Duration kRefusalLogInterval = std::chrono::seconds(10);

enum class TlsRefusal {
  kPlaintextClient,  // not TLS at all (a client without --tls_ca)
  kNoClientCert,     // mutual TLS, and the client sent no certificate
  kUntrustedClient,  // its certificate is not signed by the client CA
  kOther,            // another handshake failure (OpenSSL's reason named)
};

// The kind of a gRPC log line, or nullopt when it is not a server handshake
// failure. *reason gets OpenSSL's short reason for kOther.
std::optional<TlsRefusal> ClassifyGrpcLogLine(const char* file, int severity, const char* message,
                                              std::string* reason);

// Rate limiting, with the clock injected (unit-tested with FakeClock).
class RefusalLimiter {
 public:
  // `prefix`: "ddprund: "; `client_ca_flag`: the flag that names the CA
  // clients must be signed by ("--tls_client_ca", or the agent's "--tls_ca").
  RefusalLimiter(std::string prefix, std::string client_ca_flag);
  // The line to print for this refusal now, or nullopt (held back).
  std::optional<std::string> Note(TlsRefusal kind, const std::string& reason, TimePoint now);

 private:
  std::string Line(TlsRefusal kind, const std::string& reason) const;
  struct Slot {
    TimePoint last{};
    bool printed = false;
    std::int64_t held = 0;
  };
  std::string prefix_;
  std::string client_ca_flag_;
  std::map<TlsRefusal, Slot> slots_;
};

// Turns the stderr lines on for this process (a TLS server started) and makes
// gRPC pass its ERROR lines to its log function. Idempotent; the first call's
// names win.
void ArmTlsRefusalLog(const std::string& prefix, const std::string& client_ca_flag);

// Called by SilenceGrpcLogging's log function for every gRPC log line.
void NoteGrpcLogLine(const char* file, int severity, const char* message);

}  // namespace ddprun::rendezvous
