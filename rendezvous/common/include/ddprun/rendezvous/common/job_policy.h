// The job-wide policy: how often a job restarts, how long a round waits for
// its nodes, what a hang does, and whether checkpoints are replicated. Every
// node sends its own in its join request; the first joiner's holds for the
// job (a later node that asks for another one is told once, PolicyWarning).
// Each default is written here and nowhere else: the launcher's knob table,
// the agent, the rendezvous, the job table and the metrics hub hold a
// JobPolicy, and
// proto_convert.cc is the one place that maps it to and from the wire.
//
// A new job-wide knob is a field here (with its default), a row of
// PolicyDifferences, a field of the JobPolicy message with its conversion,
// the launcher's knob row, and the place that acts on it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/rendezvous/common/default_value.h"

namespace ddprun::rendezvous {

// What the server does once it has reported a hang.
enum class OnHang {
  kReport,   // report only; progress re-arms the detector
  kRestart,  // restart the round, a failure against max_restarts
  kAbort,    // close the job as failed
};
// "report", "restart" or "abort".
const char* OnHangName(OnHang on_hang);
// "report", "restart" or "abort" ("" is "report"); nullopt for anything else.
std::optional<OnHang> ParseOnHang(std::string_view text);

// What a worker failure restarts (docs/recovery.md).
enum class RestartPolicy {
  kJob,      // every worker of the job stops and starts again
  kInplace,  // only the failed workers; the survivors re-form in their processes
};
// "job" or "inplace".
const char* RestartPolicyName(RestartPolicy policy);
// "job" or "inplace" ("" is "job"); nullopt for anything else.
std::optional<RestartPolicy> ParseRestartPolicy(std::string_view text);

// The policy's defaults, each written once, as the text that --help, the
// docs and the knob table (launcher/knobs.h) show; JobPolicy's initialisers
// are parsed from the same text at compile time.
inline constexpr char kDefaultMaxRestarts[] = "0";
inline constexpr char kDefaultJoinTimeout[] = "600";
inline constexpr char kDefaultLastCallTimeout[] = "30";
inline constexpr char kDefaultHangTimeout[] = "300";
inline constexpr char kDefaultOnHang[] = "report";
inline constexpr char kDefaultRestartPolicy[] = "job";
inline constexpr char kDefaultCkptReplicas[] = "0";
inline constexpr char kDefaultCkptEncrypt[] = "1";

consteval OnHang DefaultOnHang(std::string_view text) {
  if (text == "report") return OnHang::kReport;
  if (text == "restart") return OnHang::kRestart;
  if (text == "abort") return OnHang::kAbort;
  throw "on_hang's default must be report, restart or abort";
}

consteval RestartPolicy DefaultRestartPolicy(std::string_view text) {
  if (text == "job") return RestartPolicy::kJob;
  if (text == "inplace") return RestartPolicy::kInplace;
  throw "restart_policy's default must be job or inplace";
}

struct JobPolicy {
  // Restarts of the whole job after worker failures before it fails. A node
  // that asks for another count is refused (JobRendezvous::CheckCompatible).
  int max_restarts = static_cast<int>(DefaultNumber(kDefaultMaxRestarts));
  // How long a node waits in an incomplete round before the round fails;
  // each node's own value applies to it (torchrun's join_timeout).
  double join_timeout_s = DefaultNumber(kDefaultJoinTimeout);
  // With MIN < MAX nodes: how long a round that has MIN waits for more.
  double last_call_timeout_s = DefaultNumber(kDefaultLastCallTimeout);
  // Seconds without progress of any rank before the server reports a hang
  // (docs/monitoring.md); <= 0: off. Long enough for an evaluation pass or a
  // checkpoint without optimizer steps; far below PyTorch's 10-30 min.
  double hang_timeout_s = DefaultNumber(kDefaultHangTimeout);
  OnHang on_hang = DefaultOnHang(kDefaultOnHang);
  // What a restart restarts: the whole job, or only the failed workers while
  // the others re-form in place (--restart_policy, docs/recovery.md).
  RestartPolicy restart_policy = DefaultRestartPolicy(kDefaultRestartPolicy);
  // --ckpt_replicas: 1, each node's newest committed checkpoint is copied
  // to the next node's agent (docs/checkpoint.md, "Peer replicas"); 0, off.
  // Job-wide, since a node sends to and restores from its neighbours.
  int ckpt_replicas = static_cast<int>(DefaultNumber(kDefaultCkptReplicas));
  // --ckpt_encrypt: 1, the replicas cross between agents in AES-256-GCM
  // records under per-connection keys (docs/security.md); 0, in plaintext
  // (authenticated either way). Job-wide, since both ends must agree.
  int ckpt_encrypt = static_cast<int>(DefaultNumber(kDefaultCkptEncrypt));

  bool operator==(const JobPolicy&) const = default;
};

// One field on which a node's policy differs from the job's.
struct PolicyDifference {
  std::string field;  // the flag's name: "hang_timeout"
  std::string asked;  // this node's value, as text: "60s"
  std::string job;    // the job's: "300s"
};

// The fields the job fixes for every node on which `asked` differs from
// `job`, in JobPolicy's order. Not join_timeout_s (each node keeps its own)
// and not max_restarts (a node that differs there is refused instead).
std::vector<PolicyDifference> PolicyDifferences(const JobPolicy& asked, const JobPolicy& job);

// The one line a node that joined with another policy is told (who: "this
// node"), and the server logs (who: "node <id>"); "" when there is no
// difference. The caller fences it with job and round (errors.h's Fence):
// "this node asked hang_timeout=60s, the job runs with 300s (the first
// node's); pass the same --hang_timeout on every node".
std::string PolicyWarning(std::string_view who, const JobPolicy& asked, const JobPolicy& job);

}  // namespace ddprun::rendezvous
