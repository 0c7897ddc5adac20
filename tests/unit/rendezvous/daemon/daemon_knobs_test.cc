// ddprund's knob table (daemon_knobs.h): the --config file, the DDPRUND_*
// variables and the flags reach the same parsers, by one precedence; an
// unknown key or a bad value is one line naming where it came from; the docs
// show every knob with the table's default. No sockets, no processes.
#include "ddprun/rendezvous/daemon/daemon_knobs.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace ddprun::rendezvous {
namespace {

using Env = std::map<std::string, std::string>;

std::function<const char*(const char*)> Lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

DaemonConfigFile File(const std::string& text) {
  auto f = ParseDaemonConfig(text, "d.yaml");
  INFO(f.status().message());
  REQUIRE(f.ok());
  return *f;
}

std::string Error(const std::map<std::string, std::string>& flags, const Env& env,
                  const std::string& yaml) {
  DaemonConfigFile f;
  if (!yaml.empty()) f = File(yaml);
  DaemonSettings s;
  absl::Status st = ResolveDaemonSettings(flags, Lookup(env), yaml.empty() ? nullptr : &f, s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  return std::string(st.message());
}

}  // namespace

TEST_CASE("ddprund knobs: defaults, then file < DDPRUND_* < flag", "[unit]") {
  DaemonSettings d;
  REQUIRE(ResolveDaemonSettings({}, Lookup({}), nullptr, d).ok());
  CHECK(d.server.host == "0.0.0.0");
  CHECK(d.server.port == 29400);
  CHECK(d.server.dashboard_port == 29480);
  CHECK(d.server.etcd_endpoints.empty());
  CHECK(d.server.etcd_prefix == "/ddprun");
  CHECK(d.server.etcd_lease_ttl_s == 2);
  CHECK(d.server.lease_timeout == std::chrono::seconds(4));
  CHECK(d.server.etcd_tls.names.cert == "--etcd_cert");
  CHECK_FALSE(d.tls.server_enabled());

  const DaemonConfigFile f = File(
      "port: 1000\n"
      "lease_timeout: 1.5\n"
      "etcd_endpoints: [e1:2379, e2, '[::1]:2380']\n"
      "etcd_prefix: /team-a\n"
      "etcd_lease_ttl: 5\n"
      "etcd_ca: /etc/ddprun/etcd-ca.pem\n"
      "etcd_cert: /etc/ddprun/etcd.pem\n"
      "tls_cert: /etc/ddprun/d.pem\n"
      "dashboard_port: 'off'\n");
  DaemonSettings s;
  REQUIRE(ResolveDaemonSettings({{"port", "3000"}},
                                Lookup({{"DDPRUND_PORT", "2000"}, {"DDPRUND_ETCD_PREFIX", "/env"}}),
                                &f, s)
              .ok());
  CHECK(s.server.port == 3000);           // flag over variable over file
  CHECK(s.server.etcd_prefix == "/env");  // variable over file
  CHECK(s.server.lease_timeout == std::chrono::milliseconds(1500));
  REQUIRE(s.server.etcd_endpoints.size() == 3);
  CHECK(s.server.etcd_endpoints[0].host == "e1");
  CHECK(s.server.etcd_endpoints[1].port == 2379);  // etcd's default port
  CHECK(s.server.etcd_endpoints[2].host == "::1");
  CHECK(s.server.etcd_endpoints[2].port == 2380);
  CHECK(s.server.etcd_lease_ttl_s == 5);
  CHECK(s.server.dashboard_port < 0);  // off
  CHECK(s.server.etcd_tls.ca_file == "/etc/ddprun/etcd-ca.pem");
  // Later messages about a file name where it came from.
  CHECK(s.server.etcd_tls.names.ca == "etcd_ca in d.yaml");
  CHECK(s.server.etcd_tls.names.key == "--etcd_key");
  CHECK(s.tls.cert_file == "/etc/ddprun/d.pem");
  CHECK(s.tls.names.cert == "tls_cert in d.yaml");
}

TEST_CASE("ddprund knobs: every source gives one line naming it for a bad value", "[unit]") {
  CHECK(Error({{"port", "x"}}, {}, "") ==
        "--port=x: must be an integer in 0..65535, got 'x'; write a port (0 lets the OS pick one)");
  CHECK(Error({}, {{"DDPRUND_PORT", "70000"}}, "") ==
        "DDPRUND_PORT=70000: must be an integer in 0..65535, got '70000'; write a port (0 lets "
        "the OS pick one)");
  CHECK(Error({}, {}, "host: h\nport: -1\n") ==
        "d.yaml:2:7: port: must be an integer in 0..65535, got '-1'; write a port (0 lets the OS "
        "pick one)");
  CHECK(Error({}, {}, "etcd_lease_ttl: 0\n") ==
        "d.yaml:1:17: etcd_lease_ttl: must be an integer in 1..3600, got '0'; write whole "
        "seconds, e.g. 2");
  CHECK(Error({{"lease_timeout", "0.1"}}, {}, "")
            .rfind("--lease_timeout=0.1: must be a number of seconds in 0.2..3600", 0) == 0);
  const std::string e = Error({}, {}, "etcd_endpoints: 'a:1,,b'\n");
  CHECK(e.rfind("d.yaml:1:17: etcd_endpoints: ", 0) == 0);
  CHECK(e.find("; write the etcd members as HOST:PORT,HOST:PORT") != std::string::npos);
  CHECK(Error({{"dashboard_port", "http"}}, {}, "").rfind("--dashboard_port=http: ", 0) == 0);
  CHECK(Error({}, {{"DDPRUND_ETCD_CA", ""}}, "") ==
        "DDPRUND_ETCD_CA=: is empty; write the path of a PEM file");
}

TEST_CASE("ddprund --config: unknown keys, lists and syntax are one line with a position",
          "[unit]") {
  auto err = [](const std::string& text) {
    auto f = ParseDaemonConfig(text, "d.yaml");
    REQUIRE_FALSE(f.ok());
    return std::string(f.status().message());
  };
  const std::string unknown = err("port: 1\netcd_endpoint: h:2379\n");
  CHECK(unknown.rfind("d.yaml:2:1: etcd_endpoint: unknown key; ddprund knows host, port, ", 0) ==
        0);
  for (const DaemonKnob& k : DaemonKnobs()) CHECK(unknown.find(k.name) != std::string::npos);
  CHECK(unknown.find('\n') == std::string::npos);
  CHECK(err("port: [1, 2]\n") == "d.yaml:1:7: port: must be a single value");
  CHECK(err("etcd_endpoints: {a: 1}\n") ==
        "d.yaml:1:17: etcd_endpoints: must be a single value or a list of HOST:PORT");
  CHECK(err("- port\n").rfind("d.yaml:1:1: (top level): must be a mapping of settings", 0) == 0);
  CHECK(err("port: [1\n").rfind("d.yaml:", 0) == 0);
  CHECK(err("port: [1\n").find(": (syntax): ") != std::string::npos);
  CHECK(err("port: 1\nport: 2\n") == "d.yaml:2:1: port: given twice; keep one");
  // Comments only: nothing set, not an error.
  CHECK(ParseDaemonConfig("# nothing yet\n", "d.yaml").ok());
}

TEST_CASE("ddprund knobs: the configs/ examples parse, docs/cli.md shows every knob", "[unit]") {
  for (const char* name : {"/configs/ddprund.yaml", "/configs/ha/ddprund-replica.yaml"}) {
    auto f = ReadDaemonConfig(std::string(DDPRUN_SOURCE_DIR) + name);
    INFO(name << ": " << f.status().message());
    REQUIRE(f.ok());
    DaemonSettings s;
    absl::Status st = ResolveDaemonSettings({}, Lookup({}), &*f, s);
    INFO(st.message());
    CHECK(st.ok());
  }
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/docs/cli.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::size_t start = doc.find("## ddprund flags");
  REQUIRE(start != std::string::npos);
  const std::string section = doc.substr(start, doc.find("\n## ", start + 1) - start);
  for (const DaemonKnob& k : DaemonKnobs()) {
    // "| `--name ...` | `default` |" or "| `--name ...` | none (...) |".
    const std::size_t row = section.find(std::string("| `--") + k.name + " ");
    INFO(k.name);
    REQUIRE(row != std::string::npos);
    const std::string line = section.substr(row, section.find('\n', row) - row);
    const std::string text = k.default_text;
    const bool plain = text.rfind("none", 0) == 0 || text.find(' ') != std::string::npos;
    CHECK(line.find("| " + (plain ? text : "`" + text + "`") + " |") != std::string::npos);
    CHECK(line.find(DaemonEnvName(k.name)) != std::string::npos);
  }
}

}  // namespace ddprun::rendezvous
