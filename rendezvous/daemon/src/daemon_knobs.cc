// ddprund's knob table and one parser per setting (daemon_knobs.h).
#include "ddprun/rendezvous/daemon/daemon_knobs.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/ha/etcd_client.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/job_table.h"

namespace ddprun::rendezvous {
namespace {

absl::Status Bad(const std::string& problem, const std::string& fix) {
  return absl::InvalidArgumentError(absl::StrCat(problem, "; ", fix));
}

absl::StatusOr<long> Integer(const std::string& text, long min, long max, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max) {
    return Bad(absl::StrCat("must be an integer in ", min, "..", max, ", got '", text, "'"),
               absl::StrCat("write ", what));
  }
  return v;
}

absl::StatusOr<double> SecondsIn(const std::string& text, double min, double max) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < min || v > max) {
    return Bad(
        absl::StrCat("must be a number of seconds in ", min, "..", max, ", got '", text, "'"),
        "write seconds, e.g. 4 or 0.5");
  }
  return v;
}

absl::Status NonEmpty(const std::string& text, const std::string& what) {
  if (text.empty()) return Bad("is empty", absl::StrCat("write ", what));
  return absl::OkStatus();
}

// The stores shared by the setters below: check, then write one field.
absl::Status StoreText(const std::string& t, const std::string& what, std::string& field) {
  if (absl::Status s = NonEmpty(t, what); !s.ok()) return s;
  field = t;
  return absl::OkStatus();
}
template <typename Int>
absl::Status StoreInt(const std::string& t, long min, long max, const std::string& what,
                      Int& field) {
  auto v = Integer(t, min, max, what);
  if (!v.ok()) return v.status();
  field = static_cast<Int>(*v);
  return absl::OkStatus();
}
absl::Status StoreSeconds(const std::string& t, double min, double max, Duration& field) {
  auto v = SecondsIn(t, min, max);
  if (!v.ok()) return v.status();
  field = Seconds(*v);
  return absl::OkStatus();
}
// A file path; its contents are checked later by the TLS loader, which names
// `source` (so the file's field and the name that messages use go together).
absl::Status StoreFile(const std::string& t, const std::string& source, std::string& path,
                       std::string& name) {
  if (absl::Status s = NonEmpty(t, "the path of a PEM file"); !s.ok()) return s;
  path = t;
  name = source;
  return absl::OkStatus();
}

// Each setter: (text, source, settings) -> Status.
using T = const std::string&;
using Setter = absl::Status (*)(T text, T source, DaemonSettings& out);
absl::Status Host(T t, T, DaemonSettings& o) {
  return StoreText(t, absl::StrCat("an address such as ", kDefaultServerHost), o.server.host);
}
absl::Status Port(T t, T, DaemonSettings& o) {
  return StoreInt(t, 0, kMaxPort, "a port (0 lets the OS pick one)", o.server.port);
}
absl::Status StateDir(T t, T, DaemonSettings& o) {
  return StoreText(t, "a directory", o.server.state_dir);
}
absl::Status LeaseTimeout(T t, T, DaemonSettings& o) {
  return StoreSeconds(t, 0.2, 3600, o.server.lease_timeout);
}
absl::Status ReattachTimeout(T t, T, DaemonSettings& o) {
  return StoreSeconds(t, 0.1, 3600, o.server.reattach_timeout);
}
absl::Status QuarantineFailures(T t, T, DaemonSettings& o) {
  return StoreInt(t, 0, 1'000'000, "a number of failures (0: never)", o.server.quarantine.failures);
}
absl::Status QuarantineCooldown(T t, T, DaemonSettings& o) {
  return StoreSeconds(t, 0, 1e7, o.server.quarantine.cooldown);
}
absl::Status TlsCert(T t, T src, DaemonSettings& o) {
  return StoreFile(t, src, o.tls.cert_file, o.tls.names.cert);
}
absl::Status TlsKey(T t, T src, DaemonSettings& o) {
  return StoreFile(t, src, o.tls.key_file, o.tls.names.key);
}
absl::Status TlsClientCa(T t, T src, DaemonSettings& o) {
  o.server.client_ca_flag = src;  // the refusal log names it
  return StoreFile(t, src, o.tls.client_ca_file, o.tls.names.client_ca);
}
absl::Status WebConfigFile(T t, T src, DaemonSettings& o) {
  if (absl::Status s = NonEmpty(t, "the path of a web configuration file, or plaintext"); !s.ok()) {
    return s;
  }
  o.web_config = t;
  o.web_config_source = src;
  return absl::OkStatus();
}
absl::Status DashboardPort(T t, T, DaemonSettings& o) {
  auto v = ParseDashboardPort(t);
  if (!v.ok()) return v.status();
  o.server.dashboard_port = *v;
  return absl::OkStatus();
}
absl::Status EtcdEndpoints(T t, T, DaemonSettings& o) {
  auto list = ParseHostPortList(t, {.default_port = 2379});
  if (!list.ok()) {
    return Bad(std::string(list.status().message()),
               "write the etcd members as HOST:PORT,HOST:PORT");
  }
  o.server.etcd_endpoints = *std::move(list);
  return absl::OkStatus();
}
absl::Status EtcdPrefix(T t, T, DaemonSettings& o) {
  // Its form is checked when the replica starts (NormalizeEtcdPrefix).
  return StoreText(t, absl::StrCat("a key prefix such as ", kDefaultEtcdPrefix),
                   o.server.etcd_prefix);
}
absl::Status EtcdLeaseTtl(T t, T, DaemonSettings& o) {
  return StoreInt(t, 1, 3600, absl::StrCat("whole seconds, e.g. ", kDefaultEtcdLeaseTtlS),
                  o.server.etcd_lease_ttl_s);
}
absl::Status EtcdMaxRequestBytes(T t, T, DaemonSettings& o) {
  return StoreInt(
      t, 16384, 1L << 31,
      absl::StrCat("bytes, etcd's --max-request-bytes, e.g. ", kEtcdDefaultMaxRequestBytes),
      o.server.etcd_max_request_bytes);
}
absl::Status Advertise(T t, T, DaemonSettings& o) {
  return StoreText(t, "HOST:PORT as agents reach this replica", o.server.advertise);
}
absl::Status EtcdCa(T t, T src, DaemonSettings& o) {
  return StoreFile(t, src, o.server.etcd_tls.ca_file, o.server.etcd_tls.names.ca);
}
absl::Status EtcdCert(T t, T src, DaemonSettings& o) {
  return StoreFile(t, src, o.server.etcd_tls.cert_file, o.server.etcd_tls.names.cert);
}
absl::Status EtcdKey(T t, T src, DaemonSettings& o) {
  return StoreFile(t, src, o.server.etcd_tls.key_file, o.server.etcd_tls.names.key);
}

// A knob whose default is `value` (written from a typed constant below), and
// one without a default, whose absence `shown` describes.
DaemonKnob Defaulted(const char* name, std::string value, const char* metavar, const char* help,
                     Setter apply) {
  return {name, value, value, metavar, help, apply};
}
DaemonKnob Undefaulted(const char* name, const char* shown, const char* metavar, const char* help,
                       Setter apply) {
  return {name, "", shown, metavar, help, apply};
}

// A duration as its knob's text takes it: seconds, "4" or "0.5".
std::string SecondsText(Duration d) {
  return absl::StrCat(std::chrono::duration<double>(d).count());
}

}  // namespace

const std::vector<DaemonKnob>& DaemonKnobs() {
  // clang-format off
  static const std::vector<DaemonKnob> kKnobs{
      Defaulted("host", std::string(kDefaultServerHost), "ADDR",
       "Address to listen on (0.0.0.0: every IPv4 interface)", Host),
      Defaulted("port", absl::StrCat(kDefaultRdzvPort), "PORT",
       "Port to listen on; 0 lets the OS pick one", Port),
      Undefaulted("state_dir", "none (in memory)", "DIR",
       "Persist jobs and their stores here (fsync), so that a restarted ddprund\n"
       "resumes them; running jobs keep running across a restart", StateDir),
      Defaulted("lease_timeout", SecondsText(kDefaultLeaseTimeout), "SECONDS",
       "An agent whose connection stays silent this long (cut network) is lost\n"
       "and its job re-forms without it (0.2..3600)", LeaseTimeout),
      Defaulted("reattach_timeout", SecondsText(kDefaultReattachTimeout), "SECONDS",
       "After a restart with --state_dir, how long a running job's agents have\n"
       "to reconnect before they count as lost (0.1..3600)", ReattachTimeout),
      Defaulted("quarantine_failures", absl::StrCat(kDefaultQuarantineFailures), "N",
       "A host whose workers fail this many times in one job is refused for the\n"
       "cooldown, so the job re-forms without it (0: never)", QuarantineFailures),
      Defaulted("quarantine_cooldown", SecondsText(kDefaultQuarantineCooldown), "SECONDS",
       "How long a quarantined host is refused; `ddprun status` shows why", QuarantineCooldown),
      Undefaulted("tls_cert", "none (plaintext)", "FILE",
       "PEM certificate (chain) of this daemon: serve TLS instead of plaintext;\n"
       "its subjectAltName must hold the name or address agents connect to", TlsCert),
      Undefaulted("tls_key", "none", "FILE", "PEM private key of --tls_cert", TlsKey),
      Undefaulted("tls_client_ca", "none (no client certificates)", "FILE",
       "Mutual TLS: require every agent, worker and `ddprun status` to present a\n"
       "certificate signed by this PEM CA (docs/tls.md)", TlsClientCa),
      Defaulted("dashboard_port", absl::StrCat(kDefaultDashboardPort), "PORT|off",
       "Monitoring HTTP port: the dashboard, /api/v1/jobs and Prometheus /metrics\n"
       "for every job (docs/monitoring.md); 0 lets the OS pick one, off disables it",
       DashboardPort),
      Undefaulted("web_config", "none (HTTPS as the gRPC port when --tls_cert is given)", "FILE",
       "TLS and basic auth of the monitoring port, in the Prometheus exporter\n"
       "toolkit's web configuration format (docs/security.md); `plaintext`\n"
       "serves plain HTTP next to a TLS gRPC port, with a warning", WebConfigFile),
      Undefaulted("etcd_endpoints", "none (one daemon)", "H:P,H:P,...",
       "Run as one replica of a replicated control plane over this etcd v3\n"
       "cluster (comma-separated members, a list in --config): replicas elect one\n"
       "leader, which serves every job and keeps it in etcd (docs/ha.md)", EtcdEndpoints),
      Defaulted("etcd_prefix", std::string(kDefaultEtcdPrefix), "PREFIX",
       "etcd key prefix of this ddprund cluster; two clusters sharing one etcd\n"
       "need two prefixes", EtcdPrefix),
      Defaulted("etcd_lease_ttl", absl::StrCat(kDefaultEtcdLeaseTtlS), "SECONDS",
       "A killed leader replica is replaced within this many seconds (1..3600;\n"
       "etcd raises values below its own minimum)", EtcdLeaseTtl),
      Defaulted("etcd_max_request_bytes", absl::StrCat(kEtcdDefaultMaxRequestBytes), "BYTES",
       "etcd's --max-request-bytes (16384..2^31): no request to etcd is larger; a\n"
       "large job's snapshot is cut into chunks under it (docs/ha.md)", EtcdMaxRequestBytes),
      Undefaulted("advertise_addr", "host:port (hostname for 0.0.0.0)", "HOST:PORT",
       "How agents reach this replica; standbys name the leader by it", Advertise),
      Undefaulted("etcd_ca", "none (plaintext to etcd)", "FILE",
       "CA certificate (PEM) that verifies etcd's members: TLS to etcd", EtcdCa),
      Undefaulted("etcd_cert", "none", "FILE",
       "Client certificate (PEM) for an etcd with --client-cert-auth", EtcdCert),
      Undefaulted("etcd_key", "none", "FILE", "The key of --etcd_cert (PEM)", EtcdKey),
  };
  // clang-format on
  return kKnobs;
}

const DaemonKnob* FindDaemonKnob(const std::string& name) {
  for (const DaemonKnob& k : DaemonKnobs()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string DaemonEnvName(const std::string& name) {
  return "DDPRUND_" + absl::AsciiStrToUpper(name);
}

}  // namespace ddprun::rendezvous
