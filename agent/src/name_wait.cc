#include "name_wait.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/socket_util.h"
#include "ddprun/rendezvous/common/wait_notice.h"

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;

// Between two lookups of a name that did not resolve: a pod's record shows up
// within about a second of the pod's IP, and a failed lookup is cheap.
constexpr auto kLookupEvery = std::chrono::milliseconds(250);

std::string Bare(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

absl::Status WaitUntilResolves(const NameToResolve& name, const rdzv::Clock& clock,
                               rdzv::TimePoint deadline, const std::function<bool()>& interrupted,
                               const std::function<void(const std::string&)>& log) {
  const std::string host = Bare(name.host);
  absl::Status last = absl::OkStatus();
  rdzv::WaitNotice notice(
      clock,
      [&] {
        return rdzv::WaitState{
            absl::StrCat("waiting for the host name '", host, "' (", name.flag,
                         ") to resolve, as a pod's DNS name does once the pod runs"),
            absl::StrCat("not yet (", last.message(), ")"), deadline,
            absl::StrCat("exit ", kExitRendezvousError, " (--rdzv_conf join_timeout)")};
      },
      log);
  for (;;) {
    absl::StatusOr<std::vector<rdzv::net::SocketAddress>> found =
        rdzv::net::ResolveTcp(host, name.port > 0 ? name.port : 0);
    if (found.ok() && !found->empty()) return absl::OkStatus();
    last = found.ok() ? absl::UnavailableError("no address") : found.status();
    const rdzv::TimePoint now = clock.Now();
    if (now >= deadline) break;
    if (interrupted && interrupted()) return absl::CancelledError("interrupted by a signal");
    notice.Poll();
    std::this_thread::sleep_for(std::min<rdzv::Duration>(
        {kLookupEvery, deadline - now, std::max<rdzv::Duration>(notice.due() - now, {})}));
  }
  return absl::UnavailableError(absl::StrCat(
      "the host name '", host, "' (", name.flag, ") did not resolve within ", name.join_timeout_s,
      " s (", last.message(),
      "); fix the name, or make sure its DNS record exists (on Kubernetes: the pod's hostname "
      "and subdomain, and a headless Service of that subdomain with "
      "publishNotReadyAddresses)"));
}

}  // namespace ddprun::agent
