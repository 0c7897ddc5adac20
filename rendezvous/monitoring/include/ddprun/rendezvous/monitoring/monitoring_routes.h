// What the monitoring HTTP port serves (docs/monitoring.md), over a
// MetricsHub, read-only:
//   /                   the dashboard (one self-contained page, no CDN)
//   /api/v1/jobs        every job's summary (JSON)
//   /api/v1/jobs/<job>  one job's document, the same as GetMetrics (JSON);
//                       404 {"error": ...} for an unknown job
//   /metrics            Prometheus text exposition
// Anything else is 404.
#pragma once

#include <string>

#include "ddprun/rendezvous/monitoring/http_server.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

HttpResponse ServeMonitoring(const MetricsHub& hub, const std::string& target);

// The dashboard page (dashboard_page.cc).
extern const char kDashboardHtml[];

}  // namespace ddprun::rendezvous
