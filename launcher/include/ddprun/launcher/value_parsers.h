// One parser per value type of the knob table (knobs.h), shared by the
// command line (flags and PET_* variables) and the job file, so that the
// same bad value gets the same message wherever it was written.
//
// Contract: each parser takes the text as written and returns the value, or
// InvalidArgument whose message is the problem and its fix in one line,
// WITHOUT naming where the value came from, e.g.
//   "must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got '3:2'".
// The caller prefixes it: "ddprun: --nnodes ", "ddprun: PET_NNODES (--nnodes) "
// or "job.yaml:2:10: nodes.count: " (UsageError / the job file's Error).
// Pure: no environment, no file system.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ddprun/agent/log_spec.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_policy.h"

namespace ddprun::launcher {

using Seconds = std::chrono::duration<double>;

// "ddprun: <message>": the launcher's usage errors (exit code kExitUsage).
absl::Status UsageError(absl::string_view message);

// kNodeRange: "N" or "MIN:MAX", 0 < MIN <= MAX <= 1000000.
struct NodeRange {
  int min = 1;
  int max = 1;
};
absl::StatusOr<NodeRange> ParseNodeRange(absl::string_view text);
std::string FormatNodeRange(NodeRange range);  // "2" or "2:4"

// kNproc: a positive number, or cpu, gpu, auto (case-insensitive).
struct NprocSpec {
  enum class Kind { kNumber, kCpu, kGpu, kXpu, kAuto } kind = Kind::kNumber;
  int number = 1;  // kNumber only
};
absl::StatusOr<NprocSpec> ParseNproc(absl::string_view text);
std::string FormatNproc(const NprocSpec& spec);  // "4", "cpu", ...

// kCount: an integer in [min, max]; `what` says which ("a non-negative integer").
absl::StatusOr<long> ParseCount(absl::string_view text, long min, long max, absl::string_view what);

// kBytes: "0", "512", "64KiB", "1.5GiB", "16G" (K, M, G, T are binary
// multiples, with or without "iB"/"B"); at most 2^50 (1 PiB).
absl::StatusOr<std::uint64_t> ParseBytes(absl::string_view text);

// kSeconds / kPositiveSeconds: a finite decimal number of seconds.
absl::StatusOr<Seconds> ParseSeconds(absl::string_view text, bool allow_zero);

// kStreams: torchrun's Std ("3", "0:3,1:2"; spaces ignored).
absl::StatusOr<agent::StdStreams> ParseStreams(absl::string_view text);
std::string FormatStreams(const agent::StdStreams& streams);  // "3" or "0:3,1:2"

// kRankList: "0,1"; empty text: every rank (an empty list).
absl::StatusOr<std::vector<int>> ParseRankList(absl::string_view text);

// kEndpoint: HOST[:PORT] (host_port.h), with default_port < 0 meaning the port
// is required. An address with several ':' must be bracketed ([v6]:PORT),
// so that "::1:5" is not silently read as a host without a port. Port 0 only
// with allow_zero_port (torchrun's single-node "localhost:0").
absl::StatusOr<rendezvous::HostPort> ParseEndpoint(absl::string_view text, int default_port,
                                                   bool allow_zero_port = false);
// kEndpoint with commas: the ddprund replicas of a replicated control plane
// (docs/ha.md), "d1:29400,d2:29400,d3:29400"; each entry as ParseEndpoint, no
// empty entry, none twice.
absl::StatusOr<std::vector<rendezvous::HostPort>> ParseEndpointList(absl::string_view text,
                                                                    int default_port);

// kPort: 1..65535.
absl::StatusOr<int> ParsePort(absl::string_view text);
// 0..65535 or off (-1, rendezvous::kDashboardOff).
absl::StatusOr<int> ParsePortOrOff(absl::string_view text);

// kBool as text (PET_* values are checked by the flag table: an integer,
// as torchrun does): true/false, yes/no, on/off, 1/0.
absl::StatusOr<bool> ParseBool(absl::string_view text);

// kText / kToken: non-empty; a token has no ','.
absl::StatusOr<std::string> ParseText(absl::string_view text);
absl::StatusOr<std::string> ParseToken(absl::string_view text);

// kJobId: job_id.h's rule.
absl::StatusOr<std::string> ParseJobIdValue(absl::string_view text);

// kBackend: "c10d", "ddprun" (an alias, returned as "c10d") or "static";
// etcd and etcd-v2 are named as unsupported.
absl::StatusOr<std::string> ParseBackend(absl::string_view text);

// kSignals: names of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
// with or without "SIG".
// kSignals: names with or without "SIG". SIGTERM, SIGINT, SIGHUP and SIGQUIT
// are always handled; SIGUSR1/SIGUSR2 are flagged; any other real signal is
// listed in `unhandled` (torchrun traps it; ddprun warns and ignores it); a
// name that is no signal is an error.
struct SignalSet {
  bool usr1 = false;
  bool usr2 = false;
  std::vector<std::string> terminating;  // SIGTERM, SIGINT, SIGHUP, SIGQUIT as named
  std::vector<std::string> unhandled;
};
absl::StatusOr<SignalSet> ParseSignals(absl::string_view text);

// kStartMethod: spawn, fork or forkserver.
absl::StatusOr<std::string> ParseStartMethod(absl::string_view text);

// kOnHang: report, restart or abort.
absl::StatusOr<rendezvous::OnHang> ParseOnHang(absl::string_view text);
// kRestartPolicy: job or inplace.
absl::StatusOr<rendezvous::RestartPolicy> ParseRestartPolicy(absl::string_view text);

// kCpuBind: auto, none, core or numa (the names are agent/cpu_binding.h's).
absl::StatusOr<std::string> ParseCpuBind(absl::string_view text);

// kScheduler: auto, slurm, mpi or none, returned in lower case.
absl::StatusOr<std::string> ParseScheduler(absl::string_view text);

// Checks `text` against the knob's type and returns it normalised as a flag
// would be written ("2:4", "0:3,1:2", "true"). kFileOnly and kRdzvConf are
// not single values (InternalError). Used by the job file, so that a file
// value is checked by exactly the parser its flag uses.
absl::StatusOr<std::string> NormalizeKnobValue(const Knob& knob, absl::string_view text);

// Edit distance, for "did you mean".
std::size_t EditDistance(absl::string_view a, absl::string_view b);

}  // namespace ddprun::launcher
