#include "ddprun/rendezvous/common/job_policy.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddprun::rendezvous {
namespace {

// Seconds as a knob shows them: "300s", "0.5s".
std::string SecondsText(double s) {
  std::ostringstream out;
  out << s << "s";
  return out.str();
}

}  // namespace

const char* OnHangName(OnHang on_hang) {
  switch (on_hang) {
    case OnHang::kReport:
      return "report";
    case OnHang::kRestart:
      return "restart";
    case OnHang::kAbort:
      return "abort";
  }
  return "report";
}

std::optional<OnHang> ParseOnHang(std::string_view text) {
  if (text.empty() || text == "report") return OnHang::kReport;
  if (text == "restart") return OnHang::kRestart;
  if (text == "abort") return OnHang::kAbort;
  return std::nullopt;
}

const char* RestartPolicyName(RestartPolicy policy) {
  return policy == RestartPolicy::kInplace ? "inplace" : "job";
}

std::optional<RestartPolicy> ParseRestartPolicy(std::string_view text) {
  if (text.empty() || text == "job") return RestartPolicy::kJob;
  if (text == "inplace") return RestartPolicy::kInplace;
  return std::nullopt;
}

std::vector<PolicyDifference> PolicyDifferences(const JobPolicy& asked, const JobPolicy& job) {
  std::vector<PolicyDifference> out;
  if (asked.last_call_timeout_s != job.last_call_timeout_s) {
    out.push_back({"last_call_timeout", SecondsText(asked.last_call_timeout_s),
                   SecondsText(job.last_call_timeout_s)});
  }
  if (asked.hang_timeout_s != job.hang_timeout_s) {
    out.push_back(
        {"hang_timeout", SecondsText(asked.hang_timeout_s), SecondsText(job.hang_timeout_s)});
  }
  if (asked.on_hang != job.on_hang) {
    out.push_back({"on_hang", OnHangName(asked.on_hang), OnHangName(job.on_hang)});
  }
  if (asked.restart_policy != job.restart_policy) {
    out.push_back({"restart_policy", RestartPolicyName(asked.restart_policy),
                   RestartPolicyName(job.restart_policy)});
  }
  if (asked.ckpt_replicas != job.ckpt_replicas) {
    out.push_back(
        {"ckpt_replicas", std::to_string(asked.ckpt_replicas), std::to_string(job.ckpt_replicas)});
  }
  if (asked.ckpt_encrypt != job.ckpt_encrypt) {
    out.push_back(
        {"ckpt_encrypt", std::to_string(asked.ckpt_encrypt), std::to_string(job.ckpt_encrypt)});
  }
  return out;
}

std::string PolicyWarning(std::string_view who, const JobPolicy& asked, const JobPolicy& job) {
  const std::vector<PolicyDifference> diff = PolicyDifferences(asked, job);
  if (diff.empty()) return "";
  std::vector<std::string> asked_text, job_text, flags;
  for (const PolicyDifference& d : diff) {
    asked_text.push_back(d.field + "=" + d.asked);
    job_text.push_back(d.job);
    // last_call_timeout is a --rdzv_conf key, the others are flags.
    flags.push_back(d.field == "last_call_timeout" ? "--rdzv_conf last_call_timeout"
                                                   : "--" + d.field);
  }
  return absl::StrCat(std::string(who), " asked ", absl::StrJoin(asked_text, ", "),
                      ", the job runs with ", absl::StrJoin(job_text, ", "),
                      " (the first node's); pass the same ", absl::StrJoin(flags, " and "),
                      " on every node");
}

}  // namespace ddprun::rendezvous
