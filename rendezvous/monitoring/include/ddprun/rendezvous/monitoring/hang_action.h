// What --on_hang=restart|abort does to the job table once the metrics hub
// published a hang report (metrics_hub.h): restart = the culprit's node
// failed (the worker-failure path: a restart round within --max_restarts,
// the job closed beyond it); abort = the job closes failed with the report
// as its reason. The one wiring of MetricsHubOptions::act, for the server
// and the tests.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"

namespace ddprun::rendezvous {

// "rank 3 on node-b (pid 4711) hung: ...": what a hang restart's
// RestartRound reason (and, beyond --max_restarts, the job's closing reason)
// says failed; `culprit` is the hub's failure for the first culprit.
std::string HangCause(const WorkerFailure& culprit);

absl::Status ApplyOnHang(JobTable& table, const std::string& job_id, std::int64_t round,
                         const std::string& node_id, OnHang action, const WorkerFailure& failure);

}  // namespace ddprun::rendezvous
