// Host and port, parsed and formatted in one place (like gRPC's host_port.h).
//
//   "node0", "node0:29400", "10.0.0.1:29400", "[fe80::1]:29400", "[fe80::1]",
//   and a bare IPv6 address "fe80::1" (no port possible then).
// Formatting puts an IPv6 host in brackets. Ports are 1..65535, or 0 where
// the caller allows "let the OS pick" (allow_zero_port).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/default_value.h"

namespace ddprun::rendezvous {

// torchrun's defaults: the c10d rendezvous endpoint and the static backend's
// MASTER_PORT.
inline constexpr int kDefaultRdzvPort = 29400;
inline constexpr char kDefaultMasterPortText[] = "29500";  // --master_port's default
inline constexpr int kDefaultMasterPort = static_cast<int>(DefaultNumber(kDefaultMasterPortText));
inline constexpr int kMaxPort = 65535;
// ddprund's monitoring HTTP port (dashboard, /api, /metrics) by default;
// the rendezvous embedded in ddprun lets the OS pick one.
inline constexpr int kDefaultDashboardPort = 29480;
inline constexpr int kDashboardOff = -1;

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
  bool operator==(const HostPort&) const = default;
};

struct HostPortOptions {
  int default_port = -1;         // used when the text has no port; < 0: a port is required
  bool allow_zero_port = false;  // port 0 = "any free port" (servers only)
};

// InvalidArgument with the reason only ("the port is empty", ...): the caller
// names the flag or key it came from. The text itself is not repeated.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text, HostPortOptions options = {});

// A comma-separated list, "h1:2379,h2:2379,[v6]:2379" (replicas, etcd members):
// each entry as ParseHostPort; empty entries and duplicates are refused.
// InvalidArgument "entry N ('text'): <reason>" (the caller names the flag).
absl::StatusOr<std::vector<HostPort>> ParseHostPortList(std::string_view text,
                                                        HostPortOptions options = {});

// "host:port", "[v6]:port".
std::string FormatHostPort(std::string_view host, int port);
inline std::string FormatHostPort(const HostPort& hp) { return FormatHostPort(hp.host, hp.port); }

// A --dashboard_port value: "off" -> kDashboardOff, or a port 0..65535
// (0: the OS picks). InvalidArgument "problem; fix" otherwise.
absl::StatusOr<int> ParseDashboardPort(std::string_view text);

}  // namespace ddprun::rendezvous
