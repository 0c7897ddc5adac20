// Two network namespaces joined by a veth pair, for tests of cut networks
// (tests/multiproc/netns_test.cc, the HA partition case in
// tests/multiproc/ha_partition_test.cc): 10.77.<n>.1/24 in namespace 1 and
// 10.77.<n>.2/24 in namespace 2; Cut() takes namespace 2's end down, Heal()
// brings it back.
//
// Needs root and iproute2's `ip`; without them ok() is false and why() says
// why (the test skips with it). The namespaces and the veth pair are named
// after the test's pid and removed in every case (RAII: declare the NetPair
// before the Harness, so that the processes that run in it are killed first);
// those of earlier runs whose process died are removed at construction.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support/process_helpers.h"

namespace ddprun::test {

// Runs a shell command with a deadline; true when it exited 0.
inline bool Sh(const std::string& cmd) {
  const std::string full = "timeout 10 " + cmd + " >/dev/null 2>&1";
  return std::system(full.c_str()) == 0;
}

inline std::string FindIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// ns1 <-veth-> ns2, 10.77.<n>.1/24 in ns1 and 10.77.<n>.2/24 in ns2.
class NetPair {
 public:
  NetPair() {
    ip_ = FindIp();
    if (::geteuid() != 0) {
      why_ = "needs root (network namespaces)";
      return;
    }
    if (ip_.empty()) {
      why_ = "needs iproute2's ip";
      return;
    }
    const std::string id = std::to_string(::getpid());
    ns1_ = "ddpft1_" + id;
    ns2_ = "ddpft2_" + id;
    veth1_ = "dft1_" + id;  // interface names: at most 15 characters
    veth2_ = "dft2_" + id;
    const std::string net = "10.77." + std::to_string(::getpid() % 250 + 1) + ".";
    addr1_ = net + "1";
    addr2_ = net + "2";
    RemoveStale();
    const std::vector<std::string> steps{
        ip_ + " netns add " + ns1_,
        ip_ + " netns add " + ns2_,
        ip_ + " link add " + veth1_ + " type veth peer name " + veth2_,
        ip_ + " link set " + veth1_ + " netns " + ns1_,
        ip_ + " link set " + veth2_ + " netns " + ns2_,
        ip_ + " -n " + ns1_ + " addr add " + addr1_ + "/24 dev " + veth1_,
        ip_ + " -n " + ns2_ + " addr add " + addr2_ + "/24 dev " + veth2_,
        ip_ + " -n " + ns1_ + " link set lo up",
        ip_ + " -n " + ns2_ + " link set lo up",
        ip_ + " -n " + ns1_ + " link set " + veth1_ + " up",
        ip_ + " -n " + ns2_ + " link set " + veth2_ + " up",
    };
    for (const std::string& s : steps) {
      if (!Sh(s)) {
        why_ = "cannot set up network namespaces (`" + s + "` failed)";
        return;
      }
    }
    // Both ends report carrier (LOWER_UP) once the pair is up.
    const auto t0 = Clock::now();
    auto up = [&](const std::string& ns, const std::string& dev) {
      return Sh(ip_ + " -n " + ns + " -o link show dev " + dev + " | grep -q LOWER_UP");
    };
    while (!(up(ns1_, veth1_) && up(ns2_, veth2_))) {
      if (SecondsSince(t0) > 5) {
        why_ = "the veth pair did not come up within 5 s";
        return;
      }
      SleepMs(10);
    }
    ok_ = true;
  }

  ~NetPair() {
    if (ns1_.empty()) return;
    Sh(ip_ + " netns del " + ns1_);
    Sh(ip_ + " netns del " + ns2_);
    Sh(ip_ + " link del " + veth1_);  // if it never left the root namespace
  }

  NetPair(const NetPair&) = delete;
  NetPair& operator=(const NetPair&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::string& addr1() const { return addr1_; }
  const std::string& addr2() const { return addr2_; }

  // argv prefix that runs a command in namespace 1 or 2.
  std::vector<std::string> In(int which) const {
    return {ip_, "netns", "exec", which == 1 ? ns1_ : ns2_};
  }

  // Takes namespace 2's end of the link down: its packets go nowhere, and
  // nothing reaches it (no FIN, no RST: a silent partition).
  bool Cut() const { return Sh(ip_ + " -n " + ns2_ + " link set " + veth2_ + " down"); }
  // Brings namespace 2's end up again and waits (5 s at most) for carrier.
  bool Heal() const {
    if (!Sh(ip_ + " -n " + ns2_ + " link set " + veth2_ + " up")) return false;
    const auto t0 = Clock::now();
    while (!Sh(ip_ + " -n " + ns2_ + " -o link show dev " + veth2_ + " | grep -q LOWER_UP")) {
      if (SecondsSince(t0) > 5) return false;
      SleepMs(10);
    }
    return true;
  }

 private:
  // Namespaces of earlier runs whose test process died without cleaning up.
  void RemoveStale() const {
    for (const std::string& n : ListDir("/run/netns")) {
      if (n.rfind("ddpft", 0) != 0 || n.size() < 8) continue;
      const std::string pid = n.substr(n.find('_') + 1);
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0) Sh(ip_ + " netns del " + n);
    }
  }

  std::string ip_, why_, ns1_, ns2_, veth1_, veth2_, addr1_, addr2_;
  bool ok_ = false;
};

// Waits for ddprund's ready line; returns its port.
inline int WaitForReadyLine(Proc& d, double timeout_s) {
  const auto t0 = Clock::now();
  const std::string prefix = "ddprund listening on ";
  while (SecondsSince(t0) < timeout_s) {
    const std::string text = d.Out();
    const std::size_t at = text.find(prefix);
    const std::size_t nl = at == std::string::npos ? at : text.find('\n', at);
    if (nl != std::string::npos) {
      const std::string addr = text.substr(at + prefix.size(), nl - at - prefix.size());
      return std::stoi(addr.substr(addr.rfind(':') + 1));
    }
    if (!IsAlive(d.pid)) FAIL("ddprund exited early: " << d.Err());
    SleepMs(5);
  }
  FAIL("ddprund printed no ready line within " << timeout_s << " s: " << d.Err());
  return -1;
}

}  // namespace ddprun::test
