// TLS on the control plane: which PEM files a gRPC server or client uses,
// and the one loader that reads and checks them before any connection is
// made. Every layer's flags end up in a TlsOptions (ddprund's --tls_*, the
// launcher's knobs, the worker's DDPRUN_TLS_* variables); the gRPC
// credentials are built from the loaded TlsConfig in rendezvous/src only
// (tls_credentials.h), so gRPC stays out of public headers.
//
// Contract of the loader: a problem with a file is ONE line of kind
// kBadInput (InvalidArgument) that names the flag, the file and the fix:
//   "--tls_key /etc/ddprun/node.key: cannot read: Permission denied; check the
//    path and that this user can read it"
//   "--tls_cert /x.pem: not a PEM certificate (no -----BEGIN CERTIFICATE-----);
//    give the PEM file of this host's certificate"
//   "--tls_key /k.pem does not belong to --tls_cert /c.pem (key values
//    mismatch); give the key the certificate was issued for"
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

// How the user named each file, for messages: a flag, a PET_ or DDPRUN_
// variable, or a job-file key. Defaults are the flags.
struct TlsSourceNames {
  std::string ca = "--tls_ca";
  std::string cert = "--tls_cert";
  std::string key = "--tls_key";
  std::string client_ca = "--tls_client_ca";
};

// File paths; empty = not given.
//   Client (agent, worker, `ddprun status`): ca_file turns TLS on and verifies
//     the server; cert_file + key_file are its certificate for mutual TLS.
//   Server (ddprund, the embedded rendezvous): cert_file + key_file turn TLS
//     on; client_ca_file requires every client to present a certificate that
//     it signed (mutual TLS).
struct TlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  TlsSourceNames names;

  bool client_enabled() const { return !ca_file.empty() || !cert_file.empty(); }
  bool server_enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// The checked PEM contents. enabled == false: plaintext.
struct TlsConfig {
  bool enabled = false;
  std::string ca_pem;         // client: roots that verify the server
  std::string cert_pem;       // our certificate chain (client: for mutual TLS)
  std::string key_pem;        // its private key
  std::string client_ca_pem;  // server: roots that verify clients; "" = no client certs
};

// Reads and checks a client's files: ca_file is required once TLS is asked
// for; cert_file and key_file come together; the key matches the certificate.
// No option set: a disabled config (plaintext).
absl::StatusOr<TlsConfig> LoadClientTls(const TlsOptions& options);

// Reads and checks a server's files: cert_file and key_file together, the key
// matching the certificate, client_ca_file (mutual TLS) only with them.
absl::StatusOr<TlsConfig> LoadServerTls(const TlsOptions& options);

// A refused TLS handshake, as a client reports it: kind kAuth
// (Unauthenticated, carrying kKindPayload = "tls"), message
//   "TLS handshake with HOST:PORT failed: <reason>; <fix>".
// Not a connection error: retrying cannot help, so callers fail at once.
absl::Status TlsHandshakeError(const std::string& target, const std::string& reason,
                               const std::string& fix);
bool IsTlsHandshakeError(const absl::Status& status);

}  // namespace ddprun::rendezvous
