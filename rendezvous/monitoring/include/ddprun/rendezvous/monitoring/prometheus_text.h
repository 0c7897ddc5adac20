// Every job's metrics in Prometheus' text exposition format (version 0.0.4):
// ddprun_* families with HELP and TYPE, labels job, node, rank and round,
// label values escaped. docs/monitoring.md explains every family.
#pragma once

#include <string>
#include <vector>

#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string PrometheusText(const std::vector<JobView>& views, const HubCounters& counters);

// A label value with \, " and newline escaped (the exposition format's rule).
std::string EscapeLabelValue(const std::string& value);

}  // namespace ddprun::rendezvous
