#include "ddprun/rendezvous/tls_credentials.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

namespace ddprun::rendezvous {

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& config) {
  if (!config.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = config.ca_pem;
  ssl.pem_cert_chain = config.cert_pem;
  ssl.pem_private_key = config.key_pem;
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& config) {
  if (!config.enabled) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      config.client_ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = config.client_ca_pem;
  ssl.pem_key_cert_pairs.push_back({config.key_pem, config.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace ddprun::rendezvous
