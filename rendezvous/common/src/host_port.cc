#include "ddprun/rendezvous/common/host_port.h"

#include <charconv>

#include "absl/status/status.h"

namespace ddprun::rendezvous {

absl::StatusOr<HostPort> ParseHostPort(std::string_view v, HostPortOptions options) {
  auto bad = [](std::string_view why) { return absl::InvalidArgumentError(std::string(why)); };
  HostPort out;
  std::string_view port_text;
  bool has_port = false;
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address needs its closing ']'");
    out.host = std::string(v.substr(1, close - 1));
    std::string_view rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("expected ':' after ']'");
      port_text = rest.substr(1);
      has_port = true;
    }
  } else {
    const size_t colon = v.rfind(':');
    if (colon != std::string_view::npos && v.find(':') != colon) {
      out.host = std::string(v);  // a bare IPv6 address: no port
    } else if (colon != std::string_view::npos) {
      out.host = std::string(v.substr(0, colon));
      port_text = v.substr(colon + 1);
      has_port = true;
    } else {
      out.host = std::string(v);
    }
  }
  if (out.host.empty()) return bad("the host is empty");
  if (out.host.find_first_of(" \t\r\n/[]") != std::string::npos) {
    return bad("the host has a space, '/' or bracket in it");
  }
  if (!has_port) {
    if (options.default_port < 0) return bad("the port is required");
    out.port = options.default_port;
    return out;
  }
  if (port_text.empty()) return bad("the port is empty");
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  const int lo = options.allow_zero_port ? 0 : 1;
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < lo ||
      port > kMaxPort) {
    return bad(options.allow_zero_port ? "the port must be 0..65535" : "the port must be 1..65535");
  }
  out.port = port;
  return out;
}

absl::StatusOr<std::vector<HostPort>> ParseHostPortList(std::string_view text,
                                                        HostPortOptions options) {
  std::vector<HostPort> out;
  std::size_t start = 0;
  for (int n = 1;; ++n) {
    const std::size_t comma = text.find(',', start);
    const std::string_view entry =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError("entry " + std::to_string(n) + " ('" + std::string(entry) +
                                        "'): " + why);
    };
    if (entry.empty()) return bad("is empty");
    absl::StatusOr<HostPort> hp = ParseHostPort(entry, options);
    if (!hp.ok()) return bad(std::string(hp.status().message()));
    for (const HostPort& seen : out) {
      if (seen == *hp) return bad("is listed twice");
    }
    out.push_back(*std::move(hp));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string FormatHostPort(std::string_view host, int port) {
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + 8);
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  out += ':';
  out += std::to_string(port);
  return out;
}

absl::StatusOr<int> ParseDashboardPort(std::string_view text) {
  if (text == "off") return kDashboardOff;
  int port = -1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, port);
  if (text.empty() || ec != std::errc() || ptr != end || port < 0 || port > kMaxPort) {
    return absl::InvalidArgumentError("'" + std::string(text.substr(0, 64)) +
                                      "' is not a port; write 0..65535 (0: the OS picks) or off");
  }
  return port;
}

}  // namespace ddprun::rendezvous
