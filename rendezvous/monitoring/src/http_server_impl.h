// The monitoring HTTP server's accept loop and its session, shared by the
// plain server (http_server.cc) and the TLS one (web_server.cc, library
// ddprun_rendezvous_monitoring_tls): a session is a template over its
// stream, a beast::tcp_stream or a beast::ssl_stream over one. Private to
// rendezvous/monitoring.
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <functional>
#include <optional>
#include <thread>

#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/monitoring/http_server.h"

namespace ddprun::rendezvous {

namespace http_impl {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
}  // namespace http_impl

// Serve, Stop, port and the destructor are virtual so that calls from the
// program reach the code of the binary that built the server: bin/ddprun
// starts a TLS server through its gRPC module, and the two binaries each
// have their own copy of Asio (and of its per-binary statics).
class HttpServer::Impl {
 public:
  using tcp = http_impl::tcp;
  // Starts serving one accepted connection (the session keeps itself alive).
  using StartSession = std::function<void(Impl* server, tcp::socket socket)>;

  Impl(HttpServerOptions options, HttpHandler handler, StartSession start)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        start_(std::move(start)),
        acceptor_(io_) {}
  virtual ~Impl() { Stop(); }

  absl::Status Listen() {
    namespace asio = http_impl::asio;
    boost::system::error_code ec;
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

  virtual void Serve() {
    if (thread_.joinable() || stopped_) return;
    thread_ = std::thread([this] { io_.run(); });
  }

  virtual void Stop() {
    if (stopped_.exchange(true)) return;
    http_impl::asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      retry_.cancel();
    });
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  virtual int port() const { return port_; }
  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  std::atomic<std::size_t>& connections() { return connections_; }
  void Refused(HttpRefusal kind, const std::string& detail) const {
    if (options_.on_refusal) options_.on_refusal(kind, detail);
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec == http_impl::asio::error::operation_aborted || !acceptor_.is_open()) return;
        // Out of file descriptors (EMFILE, ENFILE) or memory: accepting again
        // at once would fail again at once; retry in 100 ms, logged once.
        Refused(HttpRefusal::kOverLimit, ec.message());
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](boost::system::error_code wait_ec) {
          if (!wait_ec) Accept();
        });
        return;
      }
      if (connections_.load() >= options_.max_connections) {
        boost::system::error_code ignored;
        socket.close(ignored);  // over the limit: refuse by closing
        Refused(HttpRefusal::kOverLimit, "");
      } else {
        start_(this, std::move(socket));
      }
      Accept();
    });
  }

  // Destroyed in reverse order: the io_context (and the sessions its pending
  // handlers hold) before the counters the sessions touch.
  HttpServerOptions options_;
  HttpHandler handler_;
  StartSession start_;
  std::atomic<bool> stopped_{false};
  std::atomic<std::size_t> connections_{0};
  int port_ = 0;
  http_impl::asio::io_context io_;
  tcp::acceptor acceptor_;
  http_impl::asio::steady_timer retry_{io_};
  std::thread thread_;
};

namespace http_impl {

// The answer to a request, headers and body, or a 401/405 (pure; no I/O).
inline std::shared_ptr<http::response<http::string_body>> Answer(
    const HttpServer::Impl& server, const http::request<http::empty_body>& req) {
  auto res = std::make_shared<http::response<http::string_body>>();
  res->version(req.version());
  res->set(http::field::server, "ddprun");
  res->set(http::field::cache_control, "no-store");
  res->set("X-Content-Type-Options", "nosniff");
  res->set("Content-Security-Policy",
           "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
           "connect-src 'self'; img-src data:");
  const auto& authorize = server.options().authorize;
  const auto header = req[http::field::authorization];
  std::string_view path(req.target().data(), req.target().size());
  path = path.substr(0, path.find('?'));
  const auto& open = server.options().open_paths;
  const bool open_path = std::find(open.begin(), open.end(), path) != open.end();
  if (authorize && !open_path && !authorize(std::string_view(header.data(), header.size()))) {
    res->result(http::status::unauthorized);
    res->set(http::field::www_authenticate, "Basic realm=\"ddprun\"");
    res->set(http::field::content_type, "application/json");
    if (req.method() != http::verb::head) {
      res->body() =
          "{\"error\":\"unauthorized: this port needs a user and password (basic auth)\"}";
    }
  } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
    res->result(http::status::method_not_allowed);
    res->set(http::field::allow, "GET, HEAD");
    res->set(http::field::content_type, "application/json");
    res->body() = "{\"error\":\"read-only: only GET and HEAD are served\"}";
  } else {
    std::string target(req.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    HttpResponse r;
    try {
      r = server.handler()(target);
    } catch (const std::exception& e) {
      r = {500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what()};
    }
    res->result(static_cast<unsigned>(r.status));
    res->set(http::field::content_type, r.content_type);
    if (req.method() == http::verb::get) res->body() = std::move(r.body);
  }
  res->keep_alive(req.keep_alive());
  res->prepare_payload();
  return res;
}

// One connection: read a request (header limit, deadline), answer, repeat
// while the client keeps it alive. Stream: beast::tcp_stream, or an
// ssl_stream over one (its owner handshakes before the first Read()).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... Args>
  Session(HttpServer::Impl* server, Args&&... stream_args)
      : server_(server), stream_(std::forward<Args>(stream_args)...) {
    ++server_->connections();
  }
  ~Session() { --server_->connections(); }

  Stream& stream() { return stream_; }
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }
  HttpServer::Impl& server() { return *server_; }

  void Read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options().max_header_bytes));
    parser_->body_limit(0);
    tcp().expires_after(server_->options().read_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  void Close() {
    beast::error_code ignored;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    tcp().socket().close(ignored);
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec) {  // timeout, not HTTP, too large, closed: drop the connection
      if (ec == beast::error::timeout) {
        server_->Refused(HttpRefusal::kTimeout, "");
      } else if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        server_->Refused(HttpRefusal::kNotHttp, ec.message());
      }
      Close();
      return;
    }
    auto res = Answer(*server_, parser_->get());
    if (res->result() == http::status::unauthorized &&
        !parser_->get()[http::field::authorization].empty()) {
      server_->Refused(HttpRefusal::kBadCredentials, "");
    }
    tcp().expires_after(server_->options().read_timeout);
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res](beast::error_code ec, std::size_t) {
                        if (ec || !res->keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  HttpServer::Impl* server_;
  Stream stream_;
  beast::flat_buffer buffer_{16 << 10};
  std::optional<http::request_parser<http::empty_body>> parser_;
};

}  // namespace http_impl
}  // namespace ddprun::rendezvous
