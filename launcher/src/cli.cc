// ddprun's command line: CLI11 tokenises with the flags of the knob table
// (flag_table.h); the job file and placement add their layers; the merged
// values are resolved into AgentOptions (resolve_options.h); the worker
// command is built (worker_command.cc). This file holds the steps and the
// tokenising checks CLI11 does not make.
#include "ddprun/launcher/cli.h"

#include <sys/stat.h>

#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ddprun/launcher/completion.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/placement.h"
#include "ddprun/launcher/print_config.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/suggest.h"
#include "flag_table.h"
#include "resolve_options.h"

namespace ddprun::launcher {
namespace {

absl::Status UnknownOption(const std::string& token, const FlagTable& flags) {
  const std::string name = token.substr(0, token.find('='));
  const std::string hint = rendezvous::DidYouMean(name, flags.AllNames());
  return UsageError(absl::StrCat("unknown option '", name, "'", hint,
                                 "; options go before the training script, see ddprun --help"));
}

// CLI11 reads "--role=" as "--role" and takes the script as its value; find
// such empty values in the options before the script and refuse them.
absl::Status CheckEmptyValues(const std::vector<std::string>& args, const FlagTable& flags) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& token = args[i];
    if (token == "--" || token.size() < 2 || token[0] != '-') return absl::OkStatus();
    const size_t eq = token.find('=');
    const bool is_long = absl::StartsWith(token, "--");
    const std::string name = is_long ? token.substr(0, eq) : token.substr(0, 2);
    const std::optional<bool> takes_value = flags.TakesValue(name);
    if (!takes_value) return absl::OkStatus();  // unknown: reported later
    if (!*takes_value) continue;
    if (is_long && eq == token.size() - 1) {
      return UsageError(absl::StrCat(name, "= has an empty value; give one (", name,
                                     "=VALUE) or leave the flag out"));
    }
    const bool inline_value = is_long ? eq != std::string::npos : token.size() > 2;
    if (!inline_value) ++i;  // the next token is the value
  }
  return absl::OkStatus();
}

// When the last argument is a file or directory that CLI11 took as the value
// of the flag before it (`--nproc_per_node train.py`, the value forgotten):
// that flag's name and the argument, for the "missing the training script"
// message.
std::optional<std::pair<std::string, std::string>> SwallowedScript(
    const std::vector<std::string>& args, const FlagTable& flags) {
  if (args.size() < 3) return std::nullopt;
  const std::string& last = args.back();
  const std::string& flag = args[args.size() - 2];
  if (flag.size() < 2 || flag[0] != '-' || flag.find('=') != std::string::npos) return std::nullopt;
  const std::optional<bool> takes_value = flags.TakesValue(flag);
  struct stat st {};
  if (!takes_value || !*takes_value || ::stat(last.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(flag, last);
}

// CLI11's messages ("--nnodes: 1 required TEXT missing") in our one-line form.
absl::Status FromCliError(const CLI::ParseError& e) {
  std::string what = e.what();
  if (absl::StrContains(what, "required") && absl::StrContains(what, "missing")) {
    const std::string flag = what.substr(0, what.find(':'));
    return UsageError(
        absl::StrCat(flag, " needs a value (e.g. ", flag, "=VALUE); see ddprun --help"));
  }
  return UsageError(absl::StrCat(what, "; see ddprun --help"));
}

// The worker command: what CLI11 did not consume, else the file's command.
absl::StatusOr<ScriptSpec> WorkerScript(const CLI::App& app, const std::vector<std::string>& args,
                                        const FlagTable& flags, const JobConfig* job,
                                        KnobValue& command_from) {
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-') {
    return UnknownOption(rest[0], flags);
  }
  command_from = {"", "the command line", Origin::kFlag};
  if (rest.empty() && job != nullptr && !job->command.empty()) {
    rest = job->command;
    command_from = {"", absl::StrCat(job->command_location, ": command"), Origin::kFile};
  }
  if (rest.empty()) {
    if (auto swallowed = SwallowedScript(args, flags)) {
      const auto& [flag, script] = *swallowed;
      return UsageError(absl::StrCat("missing the training script: ", flag, " took '", script,
                                     "' as its value; give ", flag, " a value (e.g. ", flag,
                                     "=VALUE ", script, ")"));
    }
    return UsageError(
        "missing the training script; usage: ddprun [OPTIONS] SCRIPT [SCRIPT_ARGS...], see "
        "ddprun --help");
  }
  ScriptSpec spec;
  spec.script = rest[0];
  spec.args.assign(rest.begin() + 1, rest.end());
  DDPRUN_ASSIGN_OR_RETURN(spec.module, flags.GetBool("module"));
  DDPRUN_ASSIGN_OR_RETURN(spec.no_python, flags.GetBool("no_python"));
  DDPRUN_ASSIGN_OR_RETURN(const bool run_path, flags.GetBool("run_path"));
  if (run_path) {
    return UsageError(
        "--run_path is not supported: ddprun runs every worker as its own process; drop it to run "
        "the script with $PYTHON_EXEC");
  }
  return spec;
}

}  // namespace

std::optional<std::string> UnknownSubcommandOption(const std::string& command,
                                                   const std::vector<std::string>& args,
                                                   const std::vector<std::string>& own) {
  std::vector<std::string> known = own;
  for (const Knob& k : kKnobs) {
    if (!k.is_flag()) continue;
    known.push_back(absl::StrCat("--", k.name));
    known.push_back(absl::StrCat("--", DashName(k.name)));
  }
  for (const std::string& a : args) {
    if (a == "--") break;
    if (!absl::StartsWith(a, "--")) continue;
    const std::string name = a.substr(0, a.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    return absl::StrCat("ddprun ", command, ": unknown option '", name, "'",
                        rendezvous::DidYouMean(name, known), "; see ddprun ", command, " --help");
  }
  return std::nullopt;
}

absl::StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& args, const Env& env,
                                               const HostFacts& host) {
  CLI::App app{"", "ddprun"};
  app.prefix_command();  // the first non-option and everything after it: the worker command
  app.set_help_flag("-h,--help", "Print this help and exit");
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");
  // torchrun's (torch main, shtab): the completion script, as `ddprun completion`.
  std::string completion_shell;
  CLI::Option* print_completion =
      app.add_option(absl::StrCat(kPrintCompletionFlag, ",--print_completion"), completion_shell,
                     "Print the shell completion script (bash or zsh) and exit")
          ->type_name("SHELL");
  FlagTable flags(app, env);
  ConfigureHelp(app);

  DDPRUN_RETURN_IF_ERROR(CheckEmptyValues(args, flags));
  std::vector<std::string> reversed;  // CLI11 consumes a reversed vector
  if (args.size() > 1) reversed.assign(args.rbegin(), args.rend() - 1);
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    ParsedCommand help;
    help.action = Action::kHelp;
    help.text = app.help();
    return help;
  } catch (const CLI::ParseError& e) {
    return FromCliError(e);
  }
  ParsedCommand out;
  if (version) {
    out.action = Action::kVersion;
    out.text = absl::StrCat(VersionString(), "\n", BuildInfoString());
    return out;
  }
  if (print_completion->count() > 0) {
    auto script = CompletionScript(completion_shell);
    if (!script.ok()) {
      return UsageError(absl::StrCat(kPrintCompletionFlag, " '", completion_shell,
                                     "': ddprun completes bash and zsh; use ", kPrintCompletionFlag,
                                     " bash or ", kPrintCompletionFlag, " zsh"));
    }
    out.action = Action::kHelp;
    out.text = *std::move(script);
    if (!out.text.empty() && out.text.back() == '\n') out.text.pop_back();  // main adds it
    return out;
  }

  // --config: the job file becomes the layer below flags and PET_*; then
  // placement finds this node's rank, the node count and first_node.
  std::optional<JobConfig> job;
  std::string placement_summary;
  if (const KnobValue config = flags.Get("config"); config.is_set()) {
    auto loaded = LoadJobConfig(config.value);
    if (!loaded.ok()) return UsageError(loaded.status().message());
    job = std::move(*loaded);
    for (const auto& [dest, value] : job->FlagValues()) flags.SetFile(dest, value);
  }
  DDPRUN_ASSIGN_OR_RETURN(const std::string scheduler,
                          ParseKnob(flags, KnobNamed("scheduler"), ParseScheduler));
  const SchedulerMode mode = SchedulerModeNamed(scheduler);
  const PlacementInput in{flags.Get("nnodes"), flags.Get("node_rank"), flags.Get("rdzv_endpoint"),
                          flags.Get("local_addr"), flags.Get("rdzv_backend")};
  // --standalone asks for a single-node job: the step's other nodes run their own.
  DDPRUN_ASSIGN_OR_RETURN(const bool standalone, flags.GetBool("standalone"));
  if (job) {
    job->scheduler = mode;
    DDPRUN_ASSIGN_OR_RETURN(Placement placed, ResolvePlacement(*job, in, env, HostNames(host)));
    for (const auto& [dest, value] : placed.values) flags.SetResolved(dest, value);
    out.warnings.insert(out.warnings.end(), placed.warnings.begin(), placed.warnings.end());
    placement_summary = placed.summary;
  } else if (!standalone && SchedulerPlacesJob(env, mode)) {
    // Zero-flag placement (docs/schedulers.md): a multi-node srun step (or
    // mpirun), or --scheduler=slurm|mpi, places this node as a job file's
    // scheduler: key would, and says so in one line.
    DDPRUN_ASSIGN_OR_RETURN(SchedulerPlacement placed,
                            PlaceFromScheduler(in, flags.Get("master_addr").is_set(),
                                               flags.Get("rdzv_id").is_set(), env, mode));
    for (const auto& [dest, value] : placed.placement.values) flags.SetResolved(dest, value);
    out.warnings.insert(out.warnings.end(), placed.placement.warnings.begin(),
                        placed.placement.warnings.end());
    if (!placed.notice.empty()) out.warnings.push_back(placed.notice);
    placement_summary = placed.placement.summary;
  }
  const JobConfig* job_ptr = job ? &*job : nullptr;

  KnobValue command_from;
  DDPRUN_ASSIGN_OR_RETURN(ScriptSpec spec, WorkerScript(app, args, flags, job_ptr, command_from));
  DDPRUN_RETURN_IF_ERROR(ResolveOptions({flags, env, host, job_ptr}, out));
  DDPRUN_ASSIGN_OR_RETURN(out.options.command, BuildWorkerCommand(spec, env, &out.warnings));
  if (job) ApplyFileEnvironment(*job, env, out.options, out.warnings);

  DDPRUN_ASSIGN_OR_RETURN(const bool print_config, flags.GetBool("print_config"));
  if (print_config) {
    MergedJobView view;
    view.options = &out.options;
    view.job = job_ptr;
    view.lookup = [&flags](const std::string& dest) { return flags.Get(dest); };
    view.env = &env;
    view.command_from = command_from;
    view.placement = placement_summary;
    out.action = Action::kPrintConfig;
    out.text = RenderMergedConfig(view);
  }
  return out;
}

absl::StatusOr<ParsedCommand> ParseCommandLine(int argc, char** argv, const Env& env,
                                               const HostFacts& host) {
  return ParseCommandLine(std::vector<std::string>(argv, argv + argc), env, host);
}

}  // namespace ddprun::launcher
