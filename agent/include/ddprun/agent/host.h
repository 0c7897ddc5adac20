// Facts about this machine that the agent and the launcher both need.
#pragma once

#include <string>
#include <vector>

namespace ddprun::agent {

// Every IPv4 and IPv6 address of this machine's interfaces, as text
// ("127.0.0.1", "::1", "10.0.0.5"), each once.
std::vector<std::string> LocalAddresses();

// gethostname(2), "localhost" when it fails or is empty.
std::string Hostname();
// The hostname up to its first dot ("node1", not "node1.cluster.example");
// an IPv4 address stays whole.
std::string ShortHostname();

}  // namespace ddprun::agent
