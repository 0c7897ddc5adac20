// The command line's flags, registered on a CLI11 app from the knob table
// (knobs.h), and the one precedence rule that resolves each knob:
//
//   placement (a value found from the host list or the scheduler)
//     > --flag > PET_<FLAG> (non-empty) > the job file > the table's default
//
// Storage lives in std::map nodes (stable addresses for CLI11).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "ddprun/agent/worker_env.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"

namespace ddprun::launcher {

class FlagTable {
 public:
  // Registers every flag of kKnobs on `app` (both spellings, the short
  // one, the help text with "[default: X; env PET_X]").
  FlagTable(CLI::App& app, const agent::Env& env);

  // The merged value of a knob by Knob::Dest() ("nnodes",
  // "rdzv_conf.join_timeout"); the table's default_value when nothing sets
  // it ("" and Origin::kDefault when it has none).
  KnobValue Get(const std::string& dest) const;
  // Like Get, with the knob's parser applied; errors are usage errors that
  // name where the value came from.
  absl::StatusOr<bool> GetBool(const std::string& name) const;

  // The job file's layer, and values placement resolved (job_config.h).
  void SetFile(const std::string& dest, KnobValue v) { file_[dest] = std::move(v); }
  void SetResolved(const std::string& dest, KnobValue v) { resolved_[dest] = std::move(v); }
  const KnobValue* File(const std::string& dest) const;

  // Whether `name` ("--role", "-r") is one of ours and takes a value.
  std::optional<bool> TakesValue(const std::string& name) const;
  // Every spelling, for "did you mean".
  std::vector<std::string> AllNames() const;

 private:
  CLI::App& app_;
  const agent::Env& env_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> bools_;
  std::map<std::string, CLI::Option*> options_;
  std::map<std::string, KnobValue> file_;
  std::map<std::string, KnobValue> resolved_;
};

// "--name" for a flag, "--rdzv_conf key" for a key of --rdzv_conf: how a
// message names the knob.
std::string FlagLabel(const Knob& knob);

// The usage error for a value that failed its parser: "ddprun: <where> <problem>".
absl::Status BadValue(const KnobValue& value, const Knob& knob, const absl::Status& problem);

// Applies the knob's parser to its merged value; a failure names the source.
template <class Parse>
auto ParseKnob(const FlagTable& flags, const Knob& knob, Parse parse)
    -> decltype(parse(std::string())) {
  const KnobValue v = flags.Get(knob.Dest());
  auto parsed = parse(v.value);
  if (!parsed.ok()) return BadValue(v, knob, parsed.status());
  return parsed;
}

// --help: the description, groups in kHelpGroups order with only the
// underscore spelling shown, wrapped descriptions, and the examples footer.
void ConfigureHelp(CLI::App& app);

}  // namespace ddprun::launcher
