// A real etcd cluster for the HA tests and benchmarks (Debian's etcd-server,
// the `etcd` binary): N members on loopback with free ports, data in the
// Harness's temporary directory, started through the Harness so that none
// outlives the test. Members can be killed, stopped and restarted (same data
// directory, same ports); Leader() asks etcd which member leads.
//
// Timing: heartbeat 50 ms and election timeout 500 ms, so that a lost etcd
// leader is replaced within ~1 s and etcd's minimum lease TTL is 1 s.
#pragma once

#include <unistd.h>

#include <string>
#include <vector>

#include "ddprun/rendezvous/ha/etcd_client.h"
#include "support/process_helpers.h"

namespace ddprun::test {

// Whether the etcd binary is installed (tests skip otherwise).
inline bool EtcdAvailable() { return ::access("/usr/bin/etcd", X_OK) == 0; }

// Where the members run: on `host`, each started (and checked with etcdctl)
// through the argv prefix `wrap` (`ip netns exec NS` for a network namespace
// of support/net_pair.h). Members in a namespace are checked with etcdctl
// run there, since this process cannot reach them.
struct EtcdPlace {
  std::string host = "127.0.0.1";
  std::vector<std::string> wrap;
  // Raft timing: fast by default (a lost member is noticed in 0.5 s, leases
  // of 1 s allowed); etcd's own defaults are 100 and 1000 (leases >= 2 s).
  std::string heartbeat_ms = "50";
  std::string election_timeout_ms = "500";
  // etcd's --max-request-bytes ("" = etcd's default, 1.5 MiB): a small one
  // makes a small job reach etcd's request limit.
  std::string max_request_bytes;
};

class EtcdCluster {
 public:
  // tls_dir: serve clients over TLS with tls_dir/server.pem, server.key (and
  // require client certificates signed by tls_dir/ca.pem when client_auth).
  EtcdCluster(Harness& h, int members, const std::string& name = "etcd",
              const std::string& tls_dir = "", bool client_auth = false, EtcdPlace place = {})
      : h_(h), name_(name), tls_dir_(tls_dir), client_auth_(client_auth), place_(std::move(place)) {
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = name + std::to_string(i);
      m.client_port = FreePort();
      m.peer_port = FreePort();
      m.data = h.dir() + "/" + m.name + ".data";
      members_.push_back(m);
    }
    for (int i = 0; i < members; ++i) Launch(i, /*existing=*/false);
    if (tls_dir_.empty()) WaitHealthy(20);
  }

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:p0,127.0.0.1:p1,...": --etcd_endpoints.
  std::string endpoints() const {
    std::string out;
    for (const Member& m : members_) {
      if (!out.empty()) out += ",";
      out += place_.host + ":" + std::to_string(m.client_port);
    }
    return out;
  }
  std::string endpoint(int i) const {
    return place_.host + ":" + std::to_string(members_[i].client_port);
  }
  int client_port(int i) const { return members_[i].client_port; }

  void Kill(int i) { Signal(i, SIGKILL); }
  void Stop(int i) { Signal(i, SIGTERM); }
  // Starts a stopped member again with its data: it rejoins the cluster.
  void Restart(int i) { Launch(i, /*existing=*/true); }

  // The index of the member that leads, -1 if none answers within timeout_s.
  int Leader(double timeout_s = 5) {
    const auto t0 = Clock::now();
    while (SecondsSince(t0) < timeout_s) {
      for (int i = 0; i < size(); ++i) {
        if (!members_[i].running) continue;
        const std::string out =
            RunEtcdctl({"--endpoints", endpoint(i), "endpoint", "status", "-w", "fields"});
        const std::string id = Field(out, "\"MemberID\" : ");
        const std::string leader = Field(out, "\"Leader\" : ");
        if (!id.empty() && id == leader) return i;
      }
      SleepMs(50);
    }
    return -1;
  }

  // Until a write through every running member's list succeeds.
  void WaitHealthy(double timeout_s) {
    if (!place_.wrap.empty()) {
      const auto t0 = Clock::now();
      while (SecondsSince(t0) < timeout_s) {
        if (RunEtcdctl({"--endpoints", endpoints(), "put", "/ddprun-test-health", "ok"}) == "OK\n")
          return;
        SleepMs(50);
      }
      FAIL("etcd " << name_ << " not healthy within " << timeout_s << " s");
    }
    rendezvous::EtcdOptions o;
    for (int i = 0; i < size(); ++i) o.endpoints.push_back({"127.0.0.1", members_[i].client_port});
    o.call_timeout = std::chrono::milliseconds(500);
    auto client = rendezvous::EtcdClient::Create(o);
    REQUIRE(client.ok());
    const auto t0 = Clock::now();
    absl::Status last;
    while (SecondsSince(t0) < timeout_s) {
      auto r = (*client)->Put("/ddprun-test-health", "ok");
      if (r.ok()) return;
      last = r.status();
      SleepMs(50);
    }
    FAIL("etcd " << name_ << " not healthy within " << timeout_s << " s: " << last.message());
  }

  // The value of key, read with etcdctl ("" when absent or unreachable).
  std::string Get(const std::string& key) const {
    std::string out = RunEtcdctl({"--endpoints", endpoints(), "get", key, "--print-value-only"});
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  // A client of the whole cluster, for checks.
  std::unique_ptr<rendezvous::EtcdClient> Client() {
    rendezvous::EtcdOptions o;
    for (int i = 0; i < size(); ++i) o.endpoints.push_back({"127.0.0.1", members_[i].client_port});
    auto client = rendezvous::EtcdClient::Create(o);
    REQUIRE(client.ok());
    return *std::move(client);
  }

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data;
    Proc* proc = nullptr;
    bool running = false;
    int starts = 0;
  };

  static std::string Field(const std::string& text, const std::string& key) {
    const std::size_t at = text.find(key);
    if (at == std::string::npos) return "";
    const std::size_t end = text.find('\n', at);
    return text.substr(at + key.size(), end - at - key.size());
  }

  std::string RunEtcdctl(const std::vector<std::string>& args) const {
    std::string cmd = "ETCDCTL_API=3";
    for (const auto& w : place_.wrap) cmd += " '" + w + "'";
    cmd += " /usr/bin/etcdctl --command-timeout=1s";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " 2>/dev/null";
    std::string out;
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
      ::pclose(f);
    }
    return out;
  }

  void Launch(int i, bool existing) {
    Member& m = members_[i];
    std::string cluster;
    for (const Member& o : members_) {
      if (!cluster.empty()) cluster += ",";
      cluster += o.name + "=http://127.0.0.1:" + std::to_string(o.peer_port);
    }
    const std::string client = (tls_dir_.empty() ? "http://" : "https://") + place_.host + ":" +
                               std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> argv = place_.wrap;
    for (const std::string& a : std::vector<std::string>{"/usr/bin/etcd",
                                                         "--name",
                                                         m.name,
                                                         "--data-dir",
                                                         m.data,
                                                         "--listen-client-urls",
                                                         client,
                                                         "--advertise-client-urls",
                                                         client,
                                                         "--listen-peer-urls",
                                                         peer,
                                                         "--initial-advertise-peer-urls",
                                                         peer,
                                                         "--initial-cluster",
                                                         cluster,
                                                         "--initial-cluster-token",
                                                         name_,
                                                         "--initial-cluster-state",
                                                         existing ? "existing" : "new",
                                                         "--heartbeat-interval",
                                                         place_.heartbeat_ms,
                                                         "--election-timeout",
                                                         place_.election_timeout_ms,
                                                         "--logger",
                                                         "zap",
                                                         "--log-level",
                                                         "warn"})
      argv.push_back(a);
    if (!place_.max_request_bytes.empty()) {
      argv.push_back("--max-request-bytes");
      argv.push_back(place_.max_request_bytes);
    }
    if (!tls_dir_.empty()) {
      for (const std::string& a : {std::string("--cert-file"), tls_dir_ + "/server.pem",
                                   std::string("--key-file"), tls_dir_ + "/server.key"})
        argv.push_back(a);
      if (client_auth_) {
        for (const std::string& a : {std::string("--client-cert-auth"),
                                     std::string("--trusted-ca-file"), tls_dir_ + "/ca.pem"})
          argv.push_back(a);
      }
    }
    m.proc = &h_.Start(m.name + "." + std::to_string(m.starts++), argv);
    m.running = true;
  }

  void Signal(int i, int sig) {
    Member& m = members_[i];
    REQUIRE(m.running);
    ::kill(m.proc->pid, sig);
    h_.Wait(*m.proc, 10);
    m.running = false;
  }

  Harness& h_;
  std::string name_;
  std::string tls_dir_;
  bool client_auth_ = false;
  EtcdPlace place_;
  std::vector<Member> members_;
};

}  // namespace ddprun::test
