#include "ddprun/rendezvous/monitoring/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <optional>
#include <thread>

#include "ddprun/rendezvous/common/host_port.h"

namespace ddprun::rendezvous {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)), acceptor_(io_) {}
  ~Impl() { Stop(); }

  absl::Status Listen() {
    beast::error_code ec;
    auto address = asio::ip::make_address(options_.host, ec);
    if (!ec) {
      tcp::endpoint ep(address, static_cast<unsigned short>(options_.port));
      acceptor_.open(ep.protocol(), ec);
      if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) acceptor_.bind(ep, ec);
      if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    }
    if (ec) {
      std::string why = ec.message();
      for (auto& c : why) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return absl::UnavailableError("cannot listen on " +
                                    FormatHostPort(options_.host, options_.port) + ": " + why +
                                    "; " + options_.listen_fix);
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    if (!options_.defer_serving) Serve();
    return absl::OkStatus();
  }

  void Serve() {
    if (thread_.joinable() || stopped_) return;
    thread_ = std::thread([this] { io_.run(); });
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }

 private:
  class Session;

  void Accept();

  // Destroyed in reverse order: the io_context (and the sessions its pending
  // handlers hold) before the counters the sessions touch.
  HttpServerOptions options_;
  HttpHandler handler_;
  std::atomic<bool> stopped_{false};
  std::atomic<std::size_t> connections_{0};
  int port_ = 0;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
};

// One connection: read a request (header limit, deadline), answer, repeat
// while the client keeps it alive.
class HttpServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl* server, tcp::socket socket) : server_(server), stream_(std::move(socket)) {
    ++server_->connections_;
  }
  ~Session() { --server_->connections_; }

  void Start() { Read(); }

 private:
  void Read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options_.max_header_bytes));
    parser_->body_limit(0);
    stream_.expires_after(server_->options_.read_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec) {  // timeout, not HTTP, too large, closed: drop the connection
      Close();
      return;
    }
    const auto& req = parser_->get();
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(req.version());
    res->set(http::field::server, "ddprun");
    res->set(http::field::cache_control, "no-store");
    res->set("X-Content-Type-Options", "nosniff");
    res->set("Content-Security-Policy",
             "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
             "connect-src 'self'; img-src data:");
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res->result(http::status::method_not_allowed);
      res->set(http::field::allow, "GET, HEAD");
      res->set(http::field::content_type, "application/json");
      res->body() = "{\"error\":\"read-only: only GET and HEAD are served\"}";
    } else {
      std::string target(req.target());
      if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
      HttpResponse r;
      try {
        r = server_->handler_(target);
      } catch (const std::exception& e) {
        r = {500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what()};
      }
      res->result(static_cast<unsigned>(r.status));
      res->set(http::field::content_type, r.content_type);
      if (req.method() == http::verb::get) res->body() = std::move(r.body);
    }
    res->keep_alive(req.keep_alive());
    res->prepare_payload();
    stream_.expires_after(server_->options_.read_timeout);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
                        if (ec || !res->keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  Impl* server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{16 << 10};
  std::optional<http::request_parser<http::empty_body>> parser_;
};

void HttpServer::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    } else if (connections_.load() >= options_.max_connections) {
      beast::error_code ignored;
      socket.close(ignored);  // over the limit: refuse by closing
    } else {
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
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
