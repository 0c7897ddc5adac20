// gRPC credentials from a loaded TlsConfig (tls.h). The only place that turns
// TLS material into gRPC objects: the rendezvous server and client, the
// worker's GrpcStore and the etcd client all build their credentials here.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>

#include "ddprun/rendezvous/common/tls.h"

namespace ddprun::rendezvous {

// Insecure credentials when !config.enabled; otherwise TLS that verifies the
// server against config.ca_pem (and its name against the target's host) and
// presents cert_pem/key_pem when given (mutual TLS).
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& config);

// Insecure credentials when !config.enabled; otherwise TLS with cert_pem and
// key_pem; with client_ca_pem, every client must present a certificate that
// it signed (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& config);

}  // namespace ddprun::rendezvous
