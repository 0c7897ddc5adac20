// The job view as JSON: the one document that GetMetrics (MetricsView.json),
// the dashboard and /api/v1/jobs/<job> serve (docs/monitoring.md lists its
// fields). Unknown numbers (no samples known, no GPU, no step yet) are null.
// Never the store token: a JobView has none.
#pragma once

#include <string>
#include <vector>

#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

std::string JobViewJson(const JobView& view);
// /api/v1/jobs: {"jobs": [{job_id, round, state, world_size, ...}, ...]}.
std::string JobListJson(const std::vector<JobView>& views);
// A JSON error document {"error": message}.
std::string ErrorJson(const std::string& message);

}  // namespace ddprun::rendezvous
