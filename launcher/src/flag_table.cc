// Flag registration from the knob table, the precedence rule, and --help.
#include "flag_table.h"

#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ddprun::launcher {
namespace {

constexpr const char* kDescription =
    "ddprun runs a training script as N worker processes on each node, gives every worker\n"
    "torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...),\n"
    "restarts the whole job when a worker fails (up to --max_restarts) and re-forms it when\n"
    "nodes join or leave (--nnodes=MIN:MAX). It accepts torchrun's flags, in both the\n"
    "--flag_name and --flag-name spellings; every flag not given reads PET_<FLAG_NAME>.\n";

constexpr const char* kFooter =
    "Examples:\n"
    "  Single node, 4 workers (ddprun hosts the rendezvous itself):\n"
    "    ddprun --nproc_per_node=4 train.py --epochs 3\n"
    "  PyTorch from Debian lives under /usr/bin/python3; pick the interpreter with PYTHON_EXEC:\n"
    "    PYTHON_EXEC=/usr/bin/python3 ddprun --nproc_per_node=2 train.py\n"
    "  Several nodes: start the rendezvous daemon once (host A), then one ddprun per node:\n"
    "    ddprund --port 29400\n"
    "    ddprun --nnodes=2 --nproc_per_node=4 --rdzv_endpoint=A:29400 --rdzv_id=job1 train.py\n"
    "  Elastic, 2 to 4 nodes, up to 3 restarts of the whole job:\n"
    "    ddprun --nnodes=2:4 --max_restarts=3 --rdzv_endpoint=A:29400 --rdzv_id=job1 train.py\n"
    "  Static membership, no daemon (torchrun's static backend; node 0 hosts the store):\n"
    "    ddprun --rdzv_backend=static --nnodes=2 --node_rank=0 --master_addr=A train.py\n"
    "  A program that is not Python:\n"
    "    ddprun --nproc_per_node=2 --no_python ./worker --size 1024\n"
    "  The collectives as nccl-tests prints them, and the scaling efficiency (docs/bench.md):\n"
    "    ddprun bench --nproc_per_node=4 --op all --sizes 4K:64M\n"
    "    ddprun bench --scaling --nproc_per_node=4\n"
    "  A preflight of the job on every node, with the fix for each problem (docs/check.md):\n"
    "    ddprun check --nnodes=2 --rdzv_endpoint=A:29400 --rdzv_id=job1 train.py\n"
    "  The jobs a rendezvous serves, and one job's live per-rank metrics (docs/monitoring.md):\n"
    "    ddprun status --rdzv_endpoint=A:29400\n"
    "    ddprun top --rdzv_endpoint=A:29400 --job job1\n"
    "  Shell completion (bash or zsh; docs/cli.md):\n"
    "    source <(ddprun completion bash)\n"
    "\n"
    "Everything after the script is passed to it verbatim; \"${local_rank}\" in it becomes\n"
    "the worker's local rank. Exit status: 0 success, 1 a worker failed, 2 usage error,\n"
    "3 rendezvous error, 4 bench: a collective returned a wrong element, 5 check: a check\n"
    "warned, 6 check: a check failed, 128+N ddprun was killed by signal N. Full reference:\n"
    "docs/cli.md.";

constexpr size_t kHelpNameColumn = 36;
constexpr size_t kHelpWidth = 100;

// Greedy word wrap; CLI11 indents the lines after each '\n'.
std::string Wrap(const std::string& text, size_t width) {
  std::string out;
  size_t line = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line > 0 && line + 1 + word.size() > width) {
      out += '\n';
      line = 0;
    } else if (line > 0) {
      out += ' ';
      ++line;
    }
    absl::StrAppend(&out, word);
    line += word.size();
  }
  return out;
}

// Hides the --dash-spelling of each flag in --help (the description says both
// spellings work) so that option names stay readable, and wraps descriptions.
class DdprunFormatter : public CLI::Formatter {
 public:
  std::string make_option_desc(const CLI::Option* opt) const override {
    return Wrap(opt->get_description(), kHelpWidth - kHelpNameColumn);
  }

  std::string make_option_name(const CLI::Option* opt, bool /*is_positional*/) const override {
    std::vector<std::string> names;
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) {
      if (l.find('-') == std::string::npos) names.push_back("--" + l);
    }
    return absl::StrJoin(names, ", ");
  }
};

std::string Names(const Knob& k) {
  std::string names = k.short_flag ? absl::StrCat("-", k.short_flag, ",") : "";
  absl::StrAppend(&names, "--", k.name);
  const std::string dashed = DashName(k.name);
  if (dashed != k.name) absl::StrAppend(&names, ",--", dashed);
  return names;
}

std::string Describe(const Knob& k) {
  std::string help = k.help;
  if (k.type == ValueType::kRdzvConf) {
    // "Keys: join_timeout=SECONDS (600), ..., token=SECRET (nodes must ...)".
    std::vector<std::string> keys;
    for (const Knob& sub : kKnobs) {
      if (sub.rdzv_conf == nullptr) continue;
      keys.push_back(absl::StrCat(sub.rdzv_conf, "=", sub.metavar, " (",
                                  sub.default_value != nullptr ? sub.default_text : sub.help, ")"));
    }
    absl::StrAppend(&help, " ", absl::StrJoin(keys, ", "));
  }
  return absl::StrCat(help, " [default: ", k.default_text, "; env ", PetName(k.name), "]");
}

}  // namespace

FlagTable::FlagTable(CLI::App& app, const agent::Env& env) : app_(app), env_(env) {
  // Group by group, so that --help shows the groups in kHelpGroups order.
  for (const char* group : kHelpGroups) {
    for (const Knob& k : kKnobs) {
      if (!k.is_flag() || k.group != group) continue;
      CLI::Option* opt = nullptr;
      if (k.type == ValueType::kBool) {
        opt = app_.add_flag(Names(k), bools_[k.name], Describe(k));
      } else {
        opt = app_.add_option(Names(k), values_[k.name], Describe(k));
        opt->option_text(k.metavar);
        opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: last one wins
      }
      opt->group(group);
      options_[k.name] = opt;
    }
  }
}

KnobValue FlagTable::Get(const std::string& dest) const {
  if (auto it = resolved_.find(dest); it != resolved_.end()) return it->second;
  if (auto it = options_.find(dest); it != options_.end() && it->second->count() > 0) {
    auto v = values_.find(dest);  // an on/off flag has no value: "true"
    return {v != values_.end() ? v->second : "true", "--" + dest, Origin::kFlag};
  }
  if (options_.count(dest) > 0) {
    const std::string pet = PetName(dest);
    if (auto it = env_.find(pet); it != env_.end() && !it->second.empty()) {
      return {it->second, pet, Origin::kEnv};
    }
  }
  if (auto it = file_.find(dest); it != file_.end()) return it->second;
  const Knob* k = FindKnob(dest);
  if (k == nullptr && absl::StartsWith(dest, "rdzv_conf.")) k = FindRdzvConfKnob(dest.substr(10));
  const char* def = k != nullptr ? k->default_value : nullptr;
  return {def != nullptr ? def : "", "", Origin::kDefault};
}

const KnobValue* FlagTable::File(const std::string& dest) const {
  auto it = file_.find(dest);
  return it == file_.end() ? nullptr : &it->second;
}

// torchrun's check_env: CLI presence > PET_<NAME> as an integer (non-zero:
// on) > the file ("true"/"false") > off.
absl::StatusOr<bool> FlagTable::GetBool(const std::string& name) const {
  if (options_.at(name)->count() > 0) return true;
  const std::string pet = PetName(name);
  auto it = env_.find(pet);
  if (it == env_.end() || it->second.empty()) {
    const KnobValue* f = File(name);
    return f != nullptr && f->value == "true";
  }
  int v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return UsageError(absl::StrCat(pet, " must be an integer (1 turns --", name,
                                   " on, 0 leaves it off), got '", s, "'"));
  }
  return v != 0;
}

std::optional<bool> FlagTable::TakesValue(const std::string& name) const {
  for (const auto& [dest, opt] : options_) {
    if (opt->check_name(name)) return opt->get_type_size() != 0;
  }
  return std::nullopt;
}

std::vector<std::string> FlagTable::AllNames() const {
  std::vector<std::string> out;
  for (const auto& [dest, opt] : options_) {
    for (const std::string& l : opt->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) out.push_back("-" + s);
  }
  return out;
}

std::string FlagLabel(const Knob& knob) {
  return knob.is_flag() ? absl::StrCat("--", knob.name)
                        : absl::StrCat("--rdzv_conf ", knob.rdzv_conf);
}

absl::Status BadValue(const KnobValue& value, const Knob& knob, const absl::Status& problem) {
  return UsageError(absl::StrCat(value.Name(FlagLabel(knob)), " ", problem.message()));
}

void ConfigureHelp(CLI::App& app) {
  auto formatter = std::make_shared<DdprunFormatter>();
  formatter->column_width(kHelpNameColumn);
  formatter->label("OPTIONS", "OPTIONS] SCRIPT [SCRIPT_ARGS...");
  app.formatter(formatter);
  app.description(kDescription);
  app.footer(kFooter);
}

}  // namespace ddprun::launcher
