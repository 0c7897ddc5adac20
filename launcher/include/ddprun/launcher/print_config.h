// `ddprun --print-config`: the merged job, one "key = value  # origin source"
// line per knob (kKnobs order), then the worker command, the environment and
// NCCL variables given to every worker, and how the node found its place.
// Nothing is started.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "ddprun/agent/agent_options.h"
#include "ddprun/launcher/job_config.h"

namespace ddprun::launcher {

struct MergedJobView {
  const agent::AgentOptions* options = nullptr;
  const JobConfig* job = nullptr;  // nullptr without --config
  // The merged value of a flag ("nnodes") or of a file-only key
  // ("rdzv_conf.join_timeout"), with where it came from.
  std::function<KnobValue(const std::string& dest)> lookup;
  const std::map<std::string, std::string>* env = nullptr;  // the node's environment
  KnobValue command_from;  // where the worker command came from
  std::string placement;   // how the node rank was found ("" if not applicable)
};

std::string RenderMergedConfig(const MergedJobView& view);

}  // namespace ddprun::launcher
