// Turns the merged knob values (flag_table.h) into one node's AgentOptions:
// the job shape, the worker output, the rendezvous mode and the job file's
// environment. The rendezvous mode (standalone / static / remote / embedded)
// is decided here and only here.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/job_config.h"
#include "flag_table.h"

namespace ddprun::launcher {

struct ResolveContext {
  const FlagTable& flags;
  const agent::Env& env;
  const HostFacts& host;
  const JobConfig* job = nullptr;  // nullptr without --config
};

// The value that sets the grace period, and the knob it belongs to: --grace_period
// and torchrun 2.12's --shutdown_timeout name one setting. A flag beats a
// variable (PET_*), --grace_period wins a tie, then
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT, then the file and the default. The one rule
// for ResolveOptions and --print-config.
struct GracePeriodSource {
  KnobValue value;
  const char* knob = "grace_period";
};
GracePeriodSource ChooseGracePeriod(const std::function<KnobValue(const std::string&)>& lookup,
                                    const agent::Env& env);

// Fills out.options (except the command) and out.launcher; notes go to
// out.warnings. Every error is a one-line usage error.
absl::Status ResolveOptions(const ResolveContext& ctx, ParsedCommand& out);

// The job file's nccl: and environment.set: variables for every worker,
// unless the node's own environment already sets them (env > file); a
// warning for each environment.pass name unset on this node.
void ApplyFileEnvironment(const JobConfig& job, const agent::Env& env, agent::AgentOptions& o,
                          std::vector<std::string>& warnings);

}  // namespace ddprun::launcher
