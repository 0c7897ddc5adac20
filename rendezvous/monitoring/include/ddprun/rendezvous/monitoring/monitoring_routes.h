// What the monitoring HTTP port serves (docs/monitoring.md), over a
// MetricsHub, read-only:
//   /                   the dashboard (one self-contained page, no CDN)
//   /api/v1/jobs        every job's summary (JSON)
//   /api/v1/jobs/<job>  one job's document, the same as GetMetrics (JSON);
//                       404 {"error": ...} for an unknown job
//   /metrics            Prometheus text exposition
//   /healthz            200 "ok": the process runs and its HTTP loop answers
//                       (a liveness probe)
//   /readyz             200 when the process should get agents now, else 503;
//                       JSON {"ready", "state", "detail"} (a readiness probe;
//                       docs/monitoring.md, "Health")
// Anything else is 404. The probes need no job and no authentication of
// their own: Kubernetes' httpGet probes call them.
#pragma once

#include <functional>
#include <string>

#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

// What /readyz answers, asked on each request (on the HTTP thread: it must
// not block).
struct Readiness {
  bool ready = true;
  std::string state = "serving";  // "serving", "leader", "standby", "no leader", "etcd unreachable"
  std::string detail;             // why, in one sentence; may be empty
};
using ReadinessProbe = std::function<Readiness()>;

// `readiness` empty: always ready ("serving"), as a daemon without etcd.
HttpResponse ServeMonitoring(const MetricsHub& hub, const std::string& target,
                             const ReadinessProbe& readiness = {});

// The dashboard page (dashboard_page.cc).
extern const char kDashboardHtml[];

}  // namespace ddprun::rendezvous
