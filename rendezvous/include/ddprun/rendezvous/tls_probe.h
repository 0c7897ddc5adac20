// Why a gRPC channel cannot connect to a server that is there: gRPC reports
// a refused TLS handshake only as UNAVAILABLE with text, so a client that
// failed to connect makes ONE handshake of its own with OpenSSL, with the same
// roots and certificate, and classifies the outcome by what the TLS protocol
// itself says (a ServerHello or not, the alert the server sent, the X.509
// verification result), never by gRPC's message.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/tls.h"

namespace ddprun::rendezvous {

// What one probe handshake found, as the TLS protocol says it.
enum class TlsProblem {
  kNone,               // nothing listens, the handshake works, or the probe ran out of time
  kServerNotTls,       // a TLS client; the server sent no ServerHello
  kServerRequiresTls,  // a plaintext client; the server answered TLS
  kWrongName,          // the server's certificate is not for the host we dialled
  kUntrusted,          // the server's certificate does not verify with our CA
  kClientCertMissing,  // the server requires a client certificate; we have none
  kClientCertRefused,  // the server refused our client certificate
};

struct TlsFinding {
  TlsProblem problem = TlsProblem::kNone;
  // kUntrusted: X.509's verification error; kClientCertRefused: the alert
  // the server sent, or "" when it closed without one.
  std::string detail;
};

// One TCP connection to host:port and one OpenSSL handshake with `tls`'s
// roots and certificate; sends nothing but the TLS handshake and an HTTP/2
// preface. At most `timeout` (and never more than 2 s) is spent.
TlsFinding ProbeTls(const std::string& host, int port, const TlsConfig& tls, Duration timeout);

// Returns TlsHandshakeError (tls.h) naming the reason and the flag to fix
// when the handshake between this client's `tls` and the server at host:port
// cannot work:
//   - TLS client, server without TLS;
//   - plaintext client, TLS server;
//   - the server's certificate not signed by our CA, or not for `host`;
//   - the server requires a client certificate we lack, or refuses ours.
// Ok when none of these is found: nothing listens there, the handshake works,
// or the probe ran out of `timeout` (at most 2 s are spent). Makes one TCP
// connection; sends nothing but the TLS handshake and an HTTP/2 preface.
absl::Status DiagnoseTls(const std::string& host, int port, const TlsConfig& tls, Duration timeout);

}  // namespace ddprun::rendezvous
