// The wait for a host name that does not resolve yet (docs/schedulers.md,
// "Kubernetes"): a pod's DNS record (<pod>.<subdomain>) appears only once the
// pod runs, so a node often looks up the rendezvous host, its own name
// included, before it exists. As c10d's TCPStore client retries a failed
// lookup until its timeout, the session looks the name up again until the
// join deadline, says so in one line while it waits (WaitNotice: 5 s in,
// then every minute) and in one line at the deadline (exit 3).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::agent {

// The name looked up, and what the lines say about it.
struct NameToResolve {
  std::string host;  // a name or an address literal (resolves at once)
  int port = 0;
  std::string flag;           // where it came from: "--rdzv_endpoint", "--master_addr"
  double join_timeout_s = 0;  // shown in the lines: the policy's join_timeout
};

// OK as soon as name.host resolves (at once for an address or a name already
// known). Cancelled when `interrupted` returns true; Unavailable at
// `deadline`, its message naming the host, the resolver's last answer and
// the fix. `log` gets the waiting lines. Blocks the calling thread; each
// lookup takes what the system resolver takes.
absl::Status WaitUntilResolves(const NameToResolve& name, const rendezvous::Clock& clock,
                               rendezvous::TimePoint deadline,
                               const std::function<bool()>& interrupted,
                               const std::function<void(const std::string&)>& log);

}  // namespace ddprun::agent
