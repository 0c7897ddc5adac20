// A small read-only HTTP/1.1 server (Boost.Beast) for the dashboard, the
// JSON API and /metrics. Bounded: at most max_connections at once (more are
// closed at accept), request headers of at most max_header_bytes, no request
// body, a read deadline per request; bytes that are not HTTP close the
// connection. GET and HEAD only (405 otherwise). One I/O thread.
//
// Plain HTTP here; TLS and basic authentication (the exporter toolkit's web
// configuration, docs/security.md) are StartMonitoringServer's
// (web_server.h, library ddprun_rendezvous_monitoring_tls), so that
// bin/ddprun, which serves this port too, links no OpenSSL.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

// What a server refuses or drops, for its (rate-limited) log line.
enum class HttpRefusal {
  kOverLimit,       // a connection over max_connections, closed at accept
  kBadCredentials,  // wrong basic-auth credentials (401)
  kTlsHandshake,    // no certificate, a foreign one, not TLS at all
  kTimeout,         // a client that did not send a request in read_timeout
  kNotHttp,         // bytes that are not HTTP, or headers over the limit
};
// Called on the I/O thread; `detail` never holds a credential.
using HttpRefusalLog = std::function<void(HttpRefusal kind, const std::string& detail)>;

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
  // Authorization: the value of the request's Authorization header ("" when
  // absent) -> allowed. Null: every request is allowed. A refused request is
  // answered 401 with `WWW-Authenticate: Basic realm="ddprun"` and a body that
  // says only that credentials are needed. Every route is behind it but
  // open_paths.
  std::function<bool(std::string_view authorization)> authorize;
  // Exact paths (no query) served without basic auth: ddprund's health
  // probes (/healthz, /readyz), which a kubelet calls without credentials.
  // TLS and client certificates still apply to them.
  std::vector<std::string> open_paths;
  // Null: refusals are not logged.
  HttpRefusalLog on_refusal;
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
  // For the TLS server (web_server.cc): wraps an Impl that listens already.
  static std::unique_ptr<HttpServer> Adopt(std::unique_ptr<Impl> impl);

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
