// Where each worker's stdout and stderr go: torchrun's -r/--redirects,
// -t/--tee and --local_ranks_filter, ddprun's --prefix_output and the stderr
// tail kept for the failure report. Pure functions; the plumbing is in
// worker_logs.h (per round) and log_pump.h (the pipe reader).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::agent {

inline constexpr int kDefaultStderrTailLines = 20;

// torchrun's Std value: 0 none, 1 stdout, 2 stderr, 3 both; either one value
// for every local rank ("3") or a per-local-rank map ("0:1,1:2", unlisted
// ranks get 0).
struct StdStreams {
  int all = 0;
  std::map<int, int> per_rank;
  int ForLocalRank(int local_rank) const;
  bool IsDefault() const { return all == 0 && per_rank.empty(); }
  // Whether any local rank gets a non-zero value.
  bool Any() const;
};

// Parses "0".."3" or "RANK:V,..." (V in 0..3). The error names the value,
// not the flag; callers add the flag's name.
absl::StatusOr<StdStreams> ParseStdStreams(absl::string_view value);

struct LogSpec {
  StdStreams redirects;                 // -r: to <attempt>/<local_rank>/std{out,err}.log only
  StdStreams tee;                       // -t: to the file and to the console (prefixed)
  std::vector<int> local_ranks_filter;  // console shows only these local ranks; empty: all
  bool prefix_output = false;           // --prefix_output: prefix every console line
  // Lines of each worker's stderr kept in memory for the failure report;
  // 0 lets stderr inherit the console (no pipe, no tail).
  int stderr_tail_lines = kDefaultStderrTailLines;
  // --log_line_prefix_template, else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE;
  // empty: torchrun's default, kDefaultPrefixTemplate.
  std::string prefix_template;
  // --duplicate_stdout_filters / --duplicate_stderr_filters (torchrun 2.9+):
  // tee'd lines that contain any of these also go to the attempt's
  // filtered_stdout.log / filtered_stderr.log.
  std::vector<std::string> stdout_filters;
  std::vector<std::string> stderr_filters;

  // Whether some worker's stream goes to a file (then a log dir is needed).
  bool WritesFiles() const { return redirects.Any() || tee.Any(); }
  bool ShowsOnConsole(int local_rank) const;
};

enum class StdStream { kStdout = 1, kStderr = 2 };

// What happens to one stream of one worker.
struct StreamPlan {
  bool file = false;     // written to <attempt>/<local_rank>/stdout.log|stderr.log
  bool console = false;  // shown on ddprun's stdout (stdout) or stderr (stderr)
  bool prefix = false;   // console lines start with the worker's prefix
  int tail_lines = 0;    // last lines kept in memory
  // Whether the stream must go through a pipe read by the agent; otherwise
  // the child gets the file, the console or /dev/null directly.
  bool NeedsPipe() const { return tail_lines > 0 || (console && prefix) || (file && console); }
};

StreamPlan PlanStream(const LogSpec& spec, int local_rank, StdStream stream);

// torchrun's console prefix: "[default0]:" ("[rank0]:" with --role rank).
inline constexpr const char* kDefaultPrefixTemplate = "[${role_name}${local_rank}]:";

// The console prefix of one worker: the template (empty: the default) with
// its macros replaced as Python's string.Template.safe_substitute does for
// torchrun: ${role_name}, ${rank}, ${local_rank}, ${hostname} (and ddprun's
// ${host}, the same value), braced or not ($rank); $$ is a '$'; an unknown
// macro stays as written (torch 2.11 leaves ${pid} so too).
std::string LinePrefix(const std::string& tmpl, const std::string& host, const std::string& role,
                       int rank, int local_rank);

}  // namespace ddprun::agent
