// Which process listens on a local TCP port, as far as /proc tells this user
// (the inode of the listening socket in /proc/net/tcp{,6}, then the process
// whose /proc/<pid>/fd holds that socket): for "port in use" messages.
#pragma once

#include <string>

namespace ddprun::rendezvous {

// "pid 4711 (python3)"; "a process of another user (see: sudo ss -ltnp
// 'sport = :P')" when the socket listens but its owner is hidden; "" when
// nothing listens on the port (or /proc cannot be read).
std::string DescribePortHolder(int port);

}  // namespace ddprun::rendezvous
