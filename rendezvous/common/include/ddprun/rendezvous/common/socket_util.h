// POSIX TCP helpers for the TCPStore server and client (like c10d's
// socket.cpp): listen, accept, connect, and reads and writes over
// non-blocking sockets. Every fd made here is non-blocking and close-on-exec;
// connected ones have TCP_NODELAY.
//
// Errors are absl::Status with the reason only ("address already in use");
// the caller says what it was doing and what to do about it.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous::net {

// Owns a file descriptor and closes it.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Binds host:port (host "" = every address; port 0 = a free one) and listens.
// Errors by kind: InvalidArgument (the host does not resolve; gai_strerror),
// AlreadyExists (EADDRINUSE), PermissionDenied (EACCES), Unavailable (other).
absl::StatusOr<UniqueFd> ListenTcp(const std::string& host, int port);

// The local port of a bound socket (0 if it cannot be read).
int LocalPort(int fd);

// Accepts one pending connection. An invalid fd (errno set: EAGAIN when none
// is pending) otherwise. *peer gets "host:port" (IPv6 in brackets).
UniqueFd AcceptOne(int listen_fd, std::string* peer);

// One address of a name, as getaddrinfo gives it.
struct SocketAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = 0;
  int socktype = 0;
  int protocol = 0;
};

// The TCP addresses of host:port. Unavailable (gai_strerror) when none.
absl::StatusOr<std::vector<SocketAddress>> ResolveTcp(const std::string& host, int port);

// Connects to one address before the deadline. DeadlineExceeded
// ("connect timed out") or Unavailable (strerror).
absl::StatusOr<UniqueFd> ConnectTcp(const SocketAddress& address, TimePoint deadline);

// Sends all of `data` before the deadline. DeadlineExceeded when the peer
// does not read; Unavailable when the connection is lost.
absl::Status SendAll(int fd, std::string_view data, TimePoint deadline);

// Reads exactly n bytes before the deadline. DeadlineExceeded when they do
// not arrive; Unavailable when the peer closes or the connection is lost.
absl::Status RecvExact(int fd, char* buf, std::size_t n, TimePoint deadline);

// For readiness loops (poll/epoll): what a connection is after one call.
enum class IoState { kOpen, kEof, kError };

// Appends what can be read now, at most max_bytes, to *buf. kEof when the
// peer closed its end, kError when the connection is broken (reset).
IoState ReadAvailable(int fd, std::string* buf, std::size_t max_bytes);

// Sends what the socket takes now of `data`; *sent gets the count. kError
// when the peer is gone (EPIPE, ECONNRESET).
IoState WriteAvailable(int fd, std::string_view data, std::size_t* sent);

}  // namespace ddprun::rendezvous::net
