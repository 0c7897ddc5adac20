// A small read-only HTTP/1.1 server (Boost.Beast) for the dashboard, the
// JSON API and /metrics. Bounded: at most max_connections at once (more are
// closed at accept), request headers of at most max_header_bytes, no request
// body, a read deadline per request; bytes that are not HTTP close the
// connection. GET and HEAD only (405 otherwise). One I/O thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// target is the request's path, query string removed. Called on the I/O
// thread; must not block for long.
using HttpHandler = std::function<HttpResponse(const std::string& target)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the OS picks one
  std::size_t max_connections = 128;
  std::size_t max_header_bytes = 8 << 10;
  Duration read_timeout = std::chrono::seconds(10);
  // What a failure to listen tells the user to do ("pick another
  // --dashboard_port or `off`").
  std::string listen_fix = "pick another port";
  // Start() only binds and listens; the I/O thread starts at Serve() (a
  // client that connects before waits in the backlog). ddprun's in-process
  // rendezvous serves once its workers are spawned (docs/launch.md).
  bool defer_serving = false;
};

class HttpServer {
 public:
  // Binds and serves; Unavailable "cannot listen on HOST:PORT: <why>; <fix>".
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop()
  int port() const;
  // Starts the I/O thread of a server started with defer_serving. Idempotent;
  // a no-op once stopped. Call from one thread (the one that calls Stop()).
  void Serve();
  void Stop();  // closes every connection and joins the thread; idempotent

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
