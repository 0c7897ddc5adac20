#include "ddprun/rendezvous/common/socket_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "ddprun/rendezvous/common/host_port.h"

namespace ddprun::rendezvous::net {
namespace {

constexpr std::size_t kReadChunk = 64u << 10;

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int MillisLeft(TimePoint deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on fd until the deadline. Returns 1 ready, 0 timeout, -1 error.
int PollFor(int fd, short events, TimePoint deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, MillisLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return -1;
    return rc == 0 ? 0 : 1;
  }
}

absl::Status Lost(int err) {
  return absl::UnavailableError(std::string("lost the connection: ") + std::strerror(err));
}

std::string AddressName(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return FormatHostPort(host, port);
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::StatusOr<UniqueFd> ListenTcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const int gai =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) return absl::InvalidArgumentError(::gai_strerror(gai));
  UniqueFd listening;
  int last_errno = 0;
  for (addrinfo* ai = res; ai != nullptr && !listening.valid(); ai = ai->ai_next) {
    UniqueFd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      last_errno = errno;
      continue;
    }
    listening = std::move(fd);
  }
  ::freeaddrinfo(res);
  if (listening.valid()) return listening;
  if (last_errno == EADDRINUSE) return absl::AlreadyExistsError("address already in use");
  if (last_errno == EACCES) return absl::PermissionDeniedError("permission denied");
  return absl::UnavailableError(std::strerror(last_errno));
}

int LocalPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return 0;
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return 0;
}

UniqueFd AcceptOne(int listen_fd, std::string* peer) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  UniqueFd fd(
      ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (fd.valid()) {
    SetNoDelay(fd.get());
    *peer = AddressName(addr);
  }
  return fd;
}

absl::StatusOr<std::vector<SocketAddress>> ResolveTcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) return absl::UnavailableError(::gai_strerror(gai));
  std::vector<SocketAddress> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    SocketAddress a;
    std::memcpy(&a.addr, ai->ai_addr, std::min<std::size_t>(ai->ai_addrlen, sizeof(a.addr)));
    a.len = ai->ai_addrlen;
    a.family = ai->ai_family;
    a.socktype = ai->ai_socktype;
    a.protocol = ai->ai_protocol;
    out.push_back(a);
  }
  ::freeaddrinfo(res);
  return out;
}

absl::StatusOr<UniqueFd> ConnectTcp(const SocketAddress& address, TimePoint deadline) {
  UniqueFd fd(
      ::socket(address.family, address.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.protocol));
  if (!fd.valid()) return absl::UnavailableError(std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.addr), address.len) != 0) {
    if (errno != EINPROGRESS) return absl::UnavailableError(std::strerror(errno));
    const int rc = PollFor(fd.get(), POLLOUT, deadline);
    if (rc == 0) return absl::DeadlineExceededError("connect timed out");
    if (rc < 0) return absl::UnavailableError(std::strerror(errno));
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) return absl::UnavailableError(std::strerror(so_error));
  }
  SetNoDelay(fd.get());
  return fd;
}

absl::Status SendAll(int fd, std::string_view data, TimePoint deadline) {
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int rc = PollFor(fd, POLLOUT, deadline);
      if (rc == 0) return absl::DeadlineExceededError("timed out sending: the peer is not reading");
      if (rc > 0) continue;
    }
    return Lost(errno);
  }
  return absl::OkStatus();
}

absl::Status RecvExact(int fd, char* buf, std::size_t n, TimePoint deadline) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t got = ::recv(fd, buf + off, n - off, 0);
    if (got > 0) {
      off += got;
      continue;
    }
    if (got == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int rc = PollFor(fd, POLLIN, deadline);
      if (rc == 0) return absl::DeadlineExceededError("timed out waiting for a reply");
      if (rc > 0) continue;
    }
    return Lost(errno);
  }
  return absl::OkStatus();
}

IoState ReadAvailable(int fd, std::string* buf, std::size_t max_bytes) {
  // recv into one scratch chunk per thread and append what arrived: growing
  // `buf` by a whole chunk first would zero-fill 64 KiB per read and leave
  // every idle connection holding that capacity (1 GiB at 16k clients).
  // On the heap, allocated by the first read of each thread that reads: a
  // 64 KiB thread_local array is in every thread's static TLS block, which
  // the loader zero-fills at each thread's start (16 page faults per thread
  // of every program linking this library, docs/launch.md).
  thread_local std::unique_ptr<char[]> chunk_owner;
  if (!chunk_owner) chunk_owner.reset(new char[kReadChunk]);
  char* const chunk = chunk_owner.get();
  std::size_t total = 0;
  while (total < max_bytes) {
    const ssize_t n = ::recv(fd, chunk, kReadChunk, 0);
    if (n > 0) {
      buf->append(chunk, static_cast<std::size_t>(n));
      total += n;
      if (static_cast<std::size_t>(n) < kReadChunk) return IoState::kOpen;
      continue;
    }
    if (n == 0) return IoState::kEof;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return IoState::kOpen;
    return IoState::kError;  // ECONNRESET and the like: the peer is gone
  }
  return IoState::kOpen;
}

IoState WriteAvailable(int fd, std::string_view data, std::size_t* sent) {
  *sent = 0;
  while (*sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + *sent, data.size() - *sent, MSG_NOSIGNAL);
    if (n > 0) {
      *sent += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return IoState::kOpen;
    return IoState::kError;  // EPIPE, ECONNRESET: the peer is gone
  }
  return IoState::kOpen;
}

}  // namespace ddprun::rendezvous::net
