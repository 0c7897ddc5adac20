#include "ddprun/rendezvous/monitoring/hang_action.h"

#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {

std::string HangCause(const WorkerFailure& culprit) {
  return absl::StrCat("rank ", culprit.global_rank, " on ", culprit.host, " (pid ", culprit.pid,
                      ") hung: no progress for --hang_timeout (see the hang report)");
}

absl::Status ApplyOnHang(JobTable& table, const std::string& job_id, std::int64_t round,
                         const std::string& node_id, OnHang action, const WorkerFailure& failure) {
  switch (action) {
    case OnHang::kReport:
      return absl::OkStatus();
    case OnHang::kRestart:
      return table.Report(job_id, node_id, round, Outcome::kFailed, {failure}, HangCause(failure));
    case OnHang::kAbort:
      // The reason is the report's first line; the failure carries all of it.
      return table.Abort(job_id, round,
                         failure.error_message.substr(0, failure.error_message.find('\n')),
                         {failure});
  }
  return absl::OkStatus();
}

}  // namespace ddprun::rendezvous
