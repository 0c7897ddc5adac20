// The plain-HTTP monitoring server (http_server.h); the accept loop and the
// session are http_server_impl.h's, shared with the TLS server.
#include "ddprun/rendezvous/monitoring/http_server.h"

#include "http_server_impl.h"

namespace ddprun::rendezvous {

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  using PlainSession = http_impl::Session<http_impl::beast::tcp_stream>;
  auto impl = std::make_unique<Impl>(
      options, std::move(handler), [](Impl* server, http_impl::tcp::socket socket) {
        std::make_shared<PlainSession>(server, std::move(socket))->Read();
      });
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

std::unique_ptr<HttpServer> HttpServer::Adopt(std::unique_ptr<Impl> impl) {
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }
void HttpServer::Serve() {
  if (impl_) impl_->Serve();
}
void HttpServer::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace ddprun::rendezvous
