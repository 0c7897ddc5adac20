// DescribePortHolder against real sockets of this process: a listening
// socket is found with its pid; a port nobody listens on is "".
#include "ddprun/rendezvous/common/port_holder.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace ddprun::rendezvous {
namespace {

// A loopback socket on a port the OS picks; listening or only bound.
struct Socket {
  explicit Socket(bool listen) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    if (listen) REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Socket() { ::close(fd); }
  int fd = -1;
  int port = 0;
};

TEST_CASE("DescribePortHolder names this process for its listening socket", "[unit]") {
  Socket s(/*listen=*/true);
  const std::string holder = DescribePortHolder(s.port);
  INFO(holder);
  CHECK(holder.rfind("pid " + std::to_string(::getpid()) + " (", 0) == 0);
  CHECK(holder.back() == ')');
}

TEST_CASE("DescribePortHolder: a port bound but not listening is nobody's", "[unit]") {
  Socket s(/*listen=*/false);
  CHECK(DescribePortHolder(s.port).empty());
}

}  // namespace
}  // namespace ddprun::rendezvous
