#include "ddprun/agent/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>

namespace ddprun::agent {

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf,
                  sizeof(buf));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf,
                  sizeof(buf));
    } else {
      continue;
    }
    if (std::find(out.begin(), out.end(), buf) == out.end()) out.emplace_back(buf);
  }
  ::freeifaddrs(ifs);
  return out;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::string ShortHostname() {
  std::string host = Hostname();
  if (host.find_first_not_of("0123456789.") != std::string::npos)
    host = host.substr(0, host.find('.'));
  return host;
}

}  // namespace ddprun::agent
