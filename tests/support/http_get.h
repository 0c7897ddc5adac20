// A minimal HTTP/1.1 client for the monitoring port on loopback (tests only):
// one request, "Connection: close", the whole answer read with a 10 s poll.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <utility>

namespace ddprun::test {

// GET (or another method) on 127.0.0.1:port; returns the status code and body.
inline std::pair<int, std::string> Http(int port, const std::string& target,
                                        const std::string& method = "GET") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string req =
      method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const auto sp = resp.find(' ');
  const auto body = resp.find("\r\n\r\n");
  REQUIRE(sp != std::string::npos);
  REQUIRE(body != std::string::npos);
  return {std::stoi(resp.substr(sp + 1, 3)), resp.substr(body + 4)};
}

}  // namespace ddprun::test
