// ddprun's command line. CLI11 tokenises; every value is then resolved here
// (CLI > PET_<NAME> > default) and validated with a one-line message, so the
// same checks apply whether a value came from a flag or from the environment.
#include "ddprun/launcher/cli.h"
#include "parse_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/placement.h"
#include "ddprun/launcher/print_config.h"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "unknown"
#endif

namespace ddprun::launcher {
namespace {

using agent::AgentOptions;
using agent::RendezvousMode;

constexpr int kMaxPort = 65535;

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
    "\n"
    "Everything after the script is passed to it verbatim; \"${local_rank}\" in it becomes\n"
    "the worker's local rank. Exit status: 0 success, 1 a worker failed, 2 usage error,\n"
    "3 rendezvous error, 128+N ddprun was killed by signal N. Full reference: docs/cli.md.";

// Groups of --help, in display order.
constexpr const char* kGroupJob = "Job shape";
constexpr const char* kGroupRdzv = "Rendezvous (c10d: ddprund or embedded)";
constexpr const char* kGroupStatic = "Static rendezvous (--rdzv_backend=static)";
constexpr const char* kGroupCommand = "Worker command";
constexpr const char* kGroupOutput = "Worker output and logs";
constexpr const char* kGroupCompat = "Accepted for torchrun compatibility";
constexpr const char* kGroupConfig = "Job file (docs/config.md)";

absl::Status UsageError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("ddprun: ", message));
}

// A resolved flag value and where it came from, so that messages name what
// the user actually wrote: "--name", "PET_NAME", a job file position, or ""
// for the default (job_config.h).
using Setting = KnobValue;

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

  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::vector<std::string> names;
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) {
      const bool dash_alias = l.find('-') != std::string::npos;
      if (!dash_alias) names.push_back("--" + l);
    }
    return absl::StrJoin(names, ", ");
  }
};

// Registers torchrun-style flags on a CLI11 app and resolves them against the
// environment afterwards. Storage lives in std::map nodes (stable addresses).
class FlagTable {
 public:
  FlagTable(CLI::App& app, const Env& env) : app_(app), env_(env) {}

  // A flag taking a value. `dest` is the underscore name ("nproc_per_node");
  // the dash spelling and PET_<DEST> follow from it. `shorts` is e.g. "-r".
  CLI::Option* Value(const std::string& dest, const std::string& shorts,
                     const std::string& option_text, const std::string& help,
                     const std::string& default_text, const char* group) {
    CLI::Option* opt =
        app_.add_option(Names(dest, shorts), values_[dest], Describe(dest, help, default_text));
    opt->option_text(option_text);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: last one wins
    opt->group(group);
    options_[dest] = opt;
    return opt;
  }

  // A presence flag; PET_<DEST> set to a non-zero integer also turns it on.
  CLI::Option* Bool(const std::string& dest, const std::string& shorts, const std::string& help,
                    const char* group) {
    CLI::Option* opt =
        app_.add_flag(Names(dest, shorts), bools_[dest], Describe(dest, help, "off"));
    opt->group(group);
    options_[dest] = opt;
    return opt;
  }

  // The one precedence rule: CLI > PET_<DEST> (non-empty) > the job file
  // (--config) > default. A value placement resolved (first_node, a node
  // rank found from the host list or the scheduler) replaces its layer.
  Setting Get(const std::string& dest, const std::string& default_value) const {
    if (auto it = resolved_.find(dest); it != resolved_.end()) return it->second;
    if (options_.count(dest) > 0 && options_.at(dest)->count() > 0) {
      auto v = values_.find(dest);  // an on/off flag has no value: "true"
      return {v != values_.end() ? v->second : "true", "--" + dest, Origin::kFlag};
    }
    const std::string pet = PetName(dest);
    if (auto it = env_.find(pet); it != env_.end() && !it->second.empty()) {
      return {it->second, pet, Origin::kEnv};
    }
    if (auto it = file_.find(dest); it != file_.end()) return it->second;
    return {default_value, "", Origin::kDefault};
  }

  // The job file's layer, and values placement resolved (job_config.h).
  void SetFile(const std::string& dest, Setting s) { file_[dest] = std::move(s); }
  void SetResolved(const std::string& dest, Setting s) { resolved_[dest] = std::move(s); }
  const Setting* File(const std::string& dest) const {
    auto it = file_.find(dest);
    return it == file_.end() ? nullptr : &it->second;
  }

  // CLI presence > PET_<DEST> as an integer (non-zero: on) > file > off.
  absl::StatusOr<bool> GetBool(const std::string& dest) const {
    if (options_.at(dest)->count() > 0) return true;
    const std::string pet = PetName(dest);
    auto it = env_.find(pet);
    if (it == env_.end() || it->second.empty()) {
      const Setting* f = File(dest);
      return f != nullptr && f->value == "true";
    }
    int v = 0;
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) {
      return UsageError(absl::StrCat(pet, " must be an integer (1 turns --", dest,
                                     " on, 0 leaves it off), got '", s, "'"));
    }
    return v != 0;
  }

  // Whether `name` ("--role", "-r") is one of ours and takes a value.
  std::optional<bool> TakesValue(const std::string& name) const {
    for (const auto& [dest, opt] : options_) {
      if (opt->check_name(name)) return opt->get_type_size() != 0;
    }
    return std::nullopt;
  }

  // Every spelling, for "did you mean".
  std::vector<std::string> AllNames() const {
    std::vector<std::string> out;
    for (const auto& [dest, opt] : options_) {
      for (const std::string& l : opt->get_lnames()) out.push_back("--" + l);
      for (const std::string& s : opt->get_snames()) out.push_back("-" + s);
    }
    return out;
  }

  static std::string PetName(const std::string& dest) {
    return "PET_" + absl::AsciiStrToUpper(dest);
  }

 private:
  static std::string Names(const std::string& dest, const std::string& shorts) {
    std::string names = shorts.empty() ? "" : shorts + ",";
    absl::StrAppend(&names, "--", dest);
    std::string dashed = dest;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (dashed != dest) absl::StrAppend(&names, ",--", dashed);
    return names;
  }

  static std::string Describe(const std::string& dest, const std::string& help,
                              const std::string& default_text) {
    return absl::StrCat(help, " [default: ", default_text, "; env ", PetName(dest), "]");
  }

  CLI::App& app_;
  const Env& env_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> bools_;
  std::map<std::string, CLI::Option*> options_;
  std::map<std::string, Setting> file_;
  std::map<std::string, Setting> resolved_;
};

absl::StatusOr<int> ParseIntIn(const Setting& s, const std::string& flag, std::int64_t lo,
                               std::int64_t hi, const std::string& what) {
  auto v = ParseInt(s.value);
  if (!v || *v < lo || *v > hi) {
    return UsageError(absl::StrCat(s.Name(flag), " must be ", what, ", got '", s.value, "'"));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<double> ParseSeconds(const Setting& s, const std::string& flag, bool allow_zero) {
  auto v = ParseDouble(s.value);
  if (!v || *v < 0 || (!allow_zero && *v == 0)) {
    return UsageError(absl::StrCat(s.Name(flag), " must be a ",
                                   allow_zero ? "non-negative" : "positive",
                                   " number of seconds, got '", s.value, "'"));
  }
  return *v;
}

// "N" or "MIN:MAX", 0 < MIN <= MAX.
absl::Status ParseNnodes(const Setting& s, AgentOptions& options) {
  const std::vector<std::string> parts = absl::StrSplit(s.value, ':');
  std::optional<std::int64_t> lo, hi;
  if (parts.size() == 1) {
    lo = hi = ParseInt(parts[0]);
  } else if (parts.size() == 2) {
    lo = ParseInt(parts[0]);
    hi = ParseInt(parts[1]);
  }
  if (!lo || !hi || *lo <= 0 || *lo > *hi || *hi > 1'000'000) {
    return UsageError(absl::StrCat(
        s.Name("--nnodes"), " must be N or MIN:MAX with 0 < MIN <= MAX (e.g. 2 or 1:4), got '",
        s.value, "'"));
  }
  options.min_nodes = static_cast<int>(*lo);
  options.max_nodes = static_cast<int>(*hi);
  return absl::OkStatus();
}

absl::StatusOr<int> ParseNproc(const Setting& s, const HostFacts& host) {
  const std::string v = absl::AsciiStrToLower(s.value);
  if (v == "cpu") return std::max(1, host.cpu_count);
  if (v == "gpu") {
    if (host.gpu_count <= 0) {
      return UsageError(absl::StrCat(
          s.Name("--nproc_per_node"),
          "=gpu but no GPU found (no /proc/driver/nvidia/gpus entries or /dev/nvidia<N> "
          "devices); pass a number of workers, 'cpu' or 'auto'"));
    }
    return host.gpu_count;
  }
  if (v == "auto") return host.gpu_count > 0 ? host.gpu_count : std::max(1, host.cpu_count);
  auto n = ParseInt(v);
  if (!n || *n <= 0 || *n > 1'000'000) {
    return UsageError(absl::StrCat(s.Name("--nproc_per_node"),
                                   " must be a positive number of workers, 'cpu', 'gpu' or 'auto', "
                                   "got '",
                                   s.value, "'"));
  }
  return static_cast<int>(*n);
}

// torchrun's Std value: "0".."3", or "LOCAL_RANK:V,..." with V in 0..3.
absl::StatusOr<StdStreams> ParseStdStreams(const Setting& s, const std::string& flag) {
  auto bad = [&] {
    return UsageError(absl::StrCat(s.Name(flag),
                                   " must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a "
                                   "per-local-rank map like 0:3,1:2; got '",
                                   s.value, "'"));
  };
  StdStreams out;
  if (s.value.find(':') == std::string::npos) {
    auto v = ParseInt(s.value);
    if (!v || *v < 0 || *v > 3) return bad();
    out.all = static_cast<int>(*v);
    return out;
  }
  for (absl::string_view item : absl::StrSplit(s.value, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    auto rank = ParseInt(kv.first);
    auto v = ParseInt(kv.second);
    if (!rank || !v || *rank < 0 || *v < 0 || *v > 3) return bad();
    out.per_rank[static_cast<int>(*rank)] = static_cast<int>(*v);
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseRankList(const Setting& s, int nproc) {
  std::vector<int> ranks;
  if (s.value.empty()) return ranks;
  for (absl::string_view item : absl::StrSplit(s.value, ',')) {
    auto r = ParseInt(absl::StripAsciiWhitespace(item));
    if (!r || *r < 0) {
      return UsageError(absl::StrCat(s.Name("--local_ranks_filter"),
                                     " must be a comma-separated list of local ranks like 0,1; "
                                     "got '",
                                     s.value, "'"));
    }
    if (*r >= nproc) {
      return UsageError(absl::StrCat(s.Name("--local_ranks_filter"), " names local rank ", *r,
                                     " but --nproc_per_node is ", nproc, "; use ranks 0..",
                                     nproc - 1));
    }
    ranks.push_back(static_cast<int>(*r));
  }
  return ranks;
}

struct HostPort {
  std::string host;
  int port = 0;
};

// "host", "host:port", "[v6]:port" or "[v6]". default_port < 0: port required.
absl::StatusOr<HostPort> ParseEndpoint(const Setting& s, const std::string& flag,
                                       int default_port) {
  const std::string& v = s.value;
  auto bad = [&](absl::string_view why) {
    return UsageError(absl::StrCat(s.Name(flag), " must be HOST[:PORT] (e.g. node0:29400), ", why,
                                   "; got '", v, "'"));
  };
  HostPort out;
  std::string port_text;
  if (absl::StartsWith(v, "[")) {
    const size_t close = v.find(']');
    if (close == std::string::npos) return bad("an IPv6 address needs its closing ']'");
    out.host = v.substr(1, close - 1);
    const std::string rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return bad("expected ':' after ']'");
      port_text = rest.substr(1);
      if (port_text.empty()) return bad("the port is empty");
    }
  } else {
    const size_t colon = v.rfind(':');
    if (colon != std::string::npos && v.find(':') != colon) {
      return bad("write an IPv6 address as [ADDR]:PORT");
    }
    out.host = v.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = v.substr(colon + 1);
      if (port_text.empty()) return bad("the port is empty");
    }
  }
  if (out.host.empty()) return bad("the host is empty");
  if (port_text.empty()) {
    if (default_port < 0) return bad("the port is required");
    out.port = default_port;
    return out;
  }
  auto port = ParseInt(port_text);
  if (!port || *port <= 0 || *port > kMaxPort) return bad("the port must be 1..65535");
  out.port = static_cast<int>(*port);
  return out;
}

// --rdzv_conf k=v,... Our keys set options; torchrun's other keys are
// accepted with a warning so that torchrun command lines keep working.
absl::Status ParseRdzvConf(const Setting& s, bool is_static, AgentOptions& options,
                           std::vector<std::string>& warnings) {
  static const std::set<std::string> kTorchrunOnly = {
      "close_timeout", "heartbeat_timeout", "keep_alive_interval", "keep_alive_max_attempt",
      "read_timeout",  "is_host",           "store_type",          "rank",
      "timeout"};
  if (s.value.empty()) return absl::OkStatus();
  bool join_timeout_set = false;
  std::optional<double> static_timeout;
  for (absl::string_view item : absl::StrSplit(s.value, ',', absl::SkipWhitespace())) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return UsageError(absl::StrCat(s.Name("--rdzv_conf"),
                                     " must be KEY=VALUE pairs separated "
                                     "by commas (e.g. join_timeout=900,token=s3cret); '",
                                     item, "' has no '='"));
    }
    const std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(item.substr(eq + 1)));
    const Setting sub{value, s.source};
    const std::string name = absl::StrCat("--rdzv_conf ", key);
    if (key == "join_timeout") {
      auto v = ParseSeconds(sub, name, /*allow_zero=*/false);
      if (!v.ok()) return v.status();
      options.join_timeout_s = *v;
      join_timeout_set = true;
    } else if (key == "last_call_timeout") {
      auto v = ParseSeconds(sub, name, /*allow_zero=*/true);
      if (!v.ok()) return v.status();
      options.last_call_timeout_s = *v;
    } else if (key == "token") {
      options.join_token = value;
    } else if (key == "timeout" && is_static) {
      // static's TCPStore timeout: how long nodes wait for each other.
      auto v = ParseSeconds(sub, name, /*allow_zero=*/false);
      if (!v.ok()) return v.status();
      static_timeout = *v;
    } else if (kTorchrunOnly.count(key) > 0) {
      warnings.push_back(absl::StrCat("ddprun: --rdzv_conf key '", key,
                                      "' is a torchrun setting that ddprun does not use; ignored"));
    } else {
      return UsageError(absl::StrCat(s.Name("--rdzv_conf"), " has unknown key '", key,
                                     "'; ddprun knows join_timeout, last_call_timeout and token"));
    }
  }
  if (static_timeout && !join_timeout_set) options.join_timeout_s = *static_timeout;
  return absl::OkStatus();
}

std::string RandomJobId() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> dist;
  std::uint32_t w[4];
  for (auto& x : w) x = dist(rd);
  w[1] = (w[1] & 0xffff0fffu) | 0x00004000u;  // version 4
  w[2] = (w[2] & 0x3fffffffu) | 0x80000000u;  // variant 10
  return absl::StrFormat("%08x-%04x-%04x-%04x-%04x%08x", w[0], w[1] >> 16, w[1] & 0xffff,
                         w[2] >> 16, w[2] & 0xffff, w[3]);
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

absl::Status UnknownOption(const std::string& token, const FlagTable& flags) {
  const std::string name = token.substr(0, token.find('='));
  std::string best;
  size_t best_distance = 3;  // suggest only close matches
  for (const std::string& known : flags.AllNames()) {
    const size_t d = EditDistance(name, known);
    if (d < best_distance) {
      best_distance = d;
      best = known;
    }
  }
  std::string hint = best.empty() ? "" : absl::StrCat(" (did you mean ", best, "?)");
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

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::optional<std::string> FindOnPath(const std::string& name, const Env& env) {
  auto it = env.find("PATH");
  const std::string path =
      it != env.end() ? it->second : std::string("/usr/local/bin:/usr/bin:/bin");
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string PythonExec(const Env& env) {
  auto it = env.find("PYTHON_EXEC");
  return it != env.end() && !it->second.empty() ? it->second : kDefaultPythonExec;
}

absl::Status CheckPython(const std::string& python, const Env& env) {
  const bool found = python.find('/') != std::string::npos ? IsExecutableFile(python)
                                                           : FindOnPath(python, env).has_value();
  if (found) return absl::OkStatus();
  return UsageError(absl::StrCat("Python interpreter '", python,
                                 "' not found; install it or set PYTHON_EXEC to one (PyTorch from "
                                 "Debian: PYTHON_EXEC=/usr/bin/python3)"));
}

std::vector<std::string> Concat(std::vector<std::string> head,
                                const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

}  // namespace

int CountNvidiaGpus(const std::string& dev_dir, const std::string& proc_gpus_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(proc_gpus_dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  if (n > 0) return n;
  for (fs::directory_iterator it(dev_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && absl::StartsWith(name, "nvidia") &&
        std::all_of(name.begin() + 6, name.end(), [](char c) { return std::isdigit(c); })) {
      ++n;
    }
  }
  return n;
}

HostFacts ProbeHost() {
  HostFacts facts;
  facts.names = ProbeHostNames();
  facts.cpu_count = std::max(1u, std::thread::hardware_concurrency());
  facts.gpu_count = CountNvidiaGpus();
  return facts;
}

std::string VersionString() { return absl::StrCat("ddprun ", DDPRUN_VERSION); }

absl::StatusOr<std::vector<std::string>> BuildWorkerCommand(const ScriptSpec& spec, const Env& env,
                                                            std::vector<std::string>* warnings) {
  const std::string python = PythonExec(env);
  const std::string& script = spec.script;
  if (spec.module && spec.no_python) {
    return UsageError("-m/--module and --no_python cannot be used together; drop one of them");
  }
  if (script.empty()) {
    return UsageError("the training script is empty; usage: ddprun [OPTIONS] SCRIPT [ARGS...]");
  }
  if (spec.module) {
    if (auto s = CheckPython(python, env); !s.ok()) return s;
    return Concat({python, "-u", "-m", script}, spec.args);
  }
  const bool has_slash = script.find('/') != std::string::npos;
  const bool exists = PathExists(script);
  // A file in the working directory is run through its path: argv[0] without
  // '/' would be looked up on PATH instead.
  const std::string as_path = has_slash ? script : "./" + script;
  auto not_found = [&] {
    return UsageError(absl::StrCat("training script '", script, "' not found",
                                   has_slash ? "" : " (in the working directory or on PATH)",
                                   "; check the path"));
  };

  if (spec.no_python) {
    if (exists) {
      if (IsExecutableFile(script)) return Concat({as_path}, spec.args);
      return UsageError(absl::StrCat("'", script,
                                     "' is not an executable file; chmod +x it, "
                                     "or drop --no_python to run it with ",
                                     python));
    }
    if (!has_slash && FindOnPath(script, env)) return Concat({script}, spec.args);
    return not_found();
  }
  if (absl::EndsWith(script, ".py")) {
    if (!exists) return not_found();
    if (auto s = CheckPython(python, env); !s.ok()) return s;
    return Concat({python, "-u", script}, spec.args);
  }
  if (exists) {
    if (IsExecutableFile(script)) return Concat({as_path}, spec.args);
    if (warnings != nullptr) {
      warnings->push_back(absl::StrCat("ddprun: '", script, "' is not executable; running it as ",
                                       python, " -u ", script,
                                       " (chmod +x it to run it directly)"));
    }
    if (auto s = CheckPython(python, env); !s.ok()) return s;
    return Concat({python, "-u", script}, spec.args);
  }
  if (!has_slash && FindOnPath(script, env)) return Concat({script}, spec.args);
  return not_found();
}

absl::StatusOr<ParsedCommand> ParseCommandLine(const std::vector<std::string>& args, const Env& env,
                                               const HostFacts& host) {
  CLI::App app{kDescription, "ddprun"};
  auto formatter = std::make_shared<DdprunFormatter>();
  formatter->column_width(kHelpNameColumn);
  formatter->label("OPTIONS", "OPTIONS] SCRIPT [SCRIPT_ARGS...");
  app.formatter(formatter);
  app.footer(kFooter);
  app.prefix_command();  // the first non-option and everything after it: the worker command
  app.set_help_flag("-h,--help", "Print this help and exit");
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");

  FlagTable flags(app, env);
  // Job shape.
  flags.Value("nnodes", "", "N|MIN:MAX",
              "Number of nodes, or a range for an elastic job (0 < MIN <= MAX)", "1", kGroupJob);
  flags.Value("nproc_per_node", "", "N|cpu|gpu|auto",
              "Workers on this node: a number, cpu (hardware threads), gpu (NVIDIA GPUs) or auto "
              "(gpu if any, else cpu)",
              "1", kGroupJob);
  flags.Value("max_restarts", "", "N",
              "Restarts of the whole job after worker failures before giving up", "0", kGroupJob);
  flags.Value("role", "", "NAME", "Worker role, given to workers as ROLE_NAME", agent::kDefaultRole,
              kGroupJob);
  flags.Value("grace_period", "", "SECONDS",
              "Time between SIGTERM and SIGKILL when stopping workers (also read from "
              "TORCH_ELASTIC_SHUTDOWN_TIMEOUT)",
              "30", kGroupJob);
  flags.Value("signals_to_handle", "", "SIG,...",
              "Signals forwarded to every worker: SIGTERM, SIGINT, SIGHUP and SIGQUIT always "
              "(then the node stops); add SIGUSR1/SIGUSR2 to forward them while the job keeps "
              "running (e.g. Slurm's pre-emption warning)",
              "SIGTERM,SIGINT,SIGHUP,SIGQUIT", kGroupJob);
  // Rendezvous.
  flags.Value("rdzv_backend", "", "c10d|static",
              "c10d: dynamic rendezvous, hosted by ddprun (single node) or by ddprund at "
              "--rdzv_endpoint ('ddprun' is an alias); static: fixed membership, see below",
              "c10d", kGroupRdzv);
  flags.Value("rdzv_endpoint", "", "HOST[:PORT]",
              "ddprund (or an agent hosting the rendezvous) to join; default port 29400", "none",
              kGroupRdzv);
  flags.Value("rdzv_id", "", "ID",
              "Job id shared by every node of the job (TORCHELASTIC_RUN_ID); a random one when "
              "single-node without --rdzv_endpoint",
              "none", kGroupRdzv);
  flags.Value("rdzv_conf", "", "K=V,...",
              "join_timeout=SECONDS (600), last_call_timeout=SECONDS (30), token=SECRET (nodes "
              "must present the same token)",
              "none", kGroupRdzv);
  flags.Bool("standalone", "",
             "Single-node job with its own private rendezvous; ignores --rdzv_backend, "
             "--rdzv_endpoint and --rdzv_id",
             kGroupRdzv);
  flags.Value("node_rank", "", "N",
              "This node's rank; required by static, a requested group rank with c10d", "any",
              kGroupRdzv);
  flags.Value("local_addr", "", "ADDR",
              "Address this node advertises to the others (MASTER_ADDR when it is group rank 0)",
              "hostname", kGroupRdzv);
  // Static.
  flags.Value("master_addr", "", "ADDR", "Address of node rank 0, which hosts the store",
              "127.0.0.1", kGroupStatic);
  flags.Value("master_port", "", "PORT", "Port of node rank 0's store", "29500", kGroupStatic);
  // Worker command.
  flags.Bool("module", "-m", "Run SCRIPT as a Python module: $PYTHON_EXEC -u -m SCRIPT",
             kGroupCommand);
  flags.Bool("no_python", "",
             "Exec SCRIPT directly instead of through $PYTHON_EXEC (it must be executable)",
             kGroupCommand);
  flags.Bool("run_path", "", "Not supported: ddprun always runs workers as processes",
             kGroupCommand);
  // Output.
  flags.Value("log_dir", "", "DIR",
              "Base of <run_id>/attempt_<round>/<local_rank>/{stdout,stderr}.log and error.json",
              "a temp dir", kGroupOutput);
  flags.Value("redirects", "-r", "0-3|RANK:V,...",
              "Send worker stdout (1), stderr (2) or both (3) to files in the log dir instead "
              "of the console",
              "0", kGroupOutput);
  flags.Value("tee", "-t", "0-3|RANK:V,...",
              "Like --redirects, and also to the console, each line prefixed "
              "[host:rank:local_rank]:",
              "0", kGroupOutput);
  flags.Value("local_ranks_filter", "", "RANK,...",
              "Show only these local ranks' output on the console (files keep everything)", "all",
              kGroupOutput);
  flags.Bool("prefix_output", "",
             "Prefix every console line of the workers with [host:rank:local_rank]:",
             kGroupOutput);
  flags.Value("stderr_tail_lines", "", "N",
              "Lines of each worker's stderr kept for the failure report; 0 leaves stderr "
              "unpiped",
              "20", kGroupOutput);
  // Compatibility.
  flags.Value("monitor_interval", "", "SECONDS",
              "Ignored: ddprun reacts to worker exits as they happen instead of polling", "0.1",
              kGroupCompat);
  flags.Value("start_method", "", "spawn|fork|forkserver",
              "Ignored: workers are always separate processes", "spawn", kGroupCompat);
  // Job file.
  flags.Value("config", "", "FILE",
              "A YAML job file (docs/config.md), the same on every node; flags and PET_* "
              "override its values",
              "none", kGroupConfig);
  flags.Bool("print_config", "",
             "Print the merged job and where each value came from (flag, env, file, default), "
             "then exit without starting anything",
             kGroupConfig);

  // CLI11 consumes a reversed vector.
  if (auto s = CheckEmptyValues(args, flags); !s.ok()) return s;
  std::vector<std::string> reversed;
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
    out.text = VersionString();
    return out;
  }
  AgentOptions& o = out.options;
  std::vector<std::string>& warnings = out.warnings;

  // --config: the job file becomes the layer below flags and PET_*; then
  // placement finds this node's rank, the node count and first_node.
  std::optional<JobConfig> job;
  std::string placement_summary;
  if (const Setting config = flags.Get("config", ""); config.is_set()) {
    auto loaded = LoadJobConfig(config.value);
    if (!loaded.ok()) return UsageError(loaded.status().message());
    job = std::move(*loaded);
    for (const auto& [dest, value] : job->FlagValues()) flags.SetFile(dest, value);
    const PlacementInput in{flags.Get("nnodes", ""), flags.Get("node_rank", ""),
                            flags.Get("rdzv_endpoint", ""), flags.Get("local_addr", ""),
                            flags.Get("rdzv_backend", "c10d")};
    auto placed = ResolvePlacement(*job, in, env, host.names);
    if (!placed.ok()) return placed.status();
    for (const auto& [dest, value] : placed->values) flags.SetResolved(dest, value);
    warnings.insert(warnings.end(), placed->warnings.begin(), placed->warnings.end());
    placement_summary = placed->summary;
  }

  // The worker command: everything CLI11 did not consume.
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--")
    rest.erase(rest.begin());
  else if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-') {
    return UnknownOption(rest[0], flags);
  }
  Setting command_from{"", "the command line", Origin::kFlag};
  if (rest.empty() && job && !job->command.empty()) {
    rest = job->command;
    command_from = {"", absl::StrCat(job->command_location, ": command"), Origin::kFile};
  }
  if (rest.empty()) {
    return UsageError(
        "missing the training script; usage: ddprun [OPTIONS] SCRIPT [SCRIPT_ARGS...], see "
        "ddprun --help");
  }

  // Booleans.
  auto standalone = flags.GetBool("standalone");
  if (!standalone.ok()) return standalone.status();
  auto module = flags.GetBool("module");
  if (!module.ok()) return module.status();
  auto no_python = flags.GetBool("no_python");
  if (!no_python.ok()) return no_python.status();
  auto run_path = flags.GetBool("run_path");
  if (!run_path.ok()) return run_path.status();
  if (*run_path) {
    return UsageError(
        "--run_path is not supported: ddprun runs every worker as its own process; drop it to run "
        "the script with $PYTHON_EXEC");
  }

  // Job shape.
  if (auto s = ParseNnodes(flags.Get("nnodes", "1"), o); !s.ok()) return s;
  {
    auto n = ParseNproc(flags.Get("nproc_per_node", "1"), host);
    if (!n.ok()) return n.status();
    o.nproc_per_node = *n;
  }
  {
    auto n = ParseIntIn(flags.Get("max_restarts", "0"), "--max_restarts", 0, 1'000'000,
                        "a non-negative integer");
    if (!n.ok()) return n.status();
    o.max_restarts = *n;
  }
  {
    Setting role = flags.Get("role", agent::kDefaultRole);
    if (role.value.empty()) return UsageError("--role must not be empty");
    o.role = role.value;
  }
  {
    Setting grace = flags.Get("grace_period", "");
    if (!grace.is_set() || grace.origin == Origin::kFile) {
      if (auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
          it != env.end() && !it->second.empty()) {
        grace = {it->second, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", Origin::kEnv};
      }
    }
    if (grace.is_set()) {
      auto g = ParseSeconds(grace, "--grace_period", /*allow_zero=*/true);
      if (!g.ok()) return g.status();
      o.grace_period_s = *g;
    }
  }

  {
    Setting sigs = flags.Get("signals_to_handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    for (absl::string_view name : absl::StrSplit(sigs.value, ',', absl::SkipWhitespace())) {
      std::string n(absl::StripAsciiWhitespace(name));
      if (n.rfind("SIG", 0) != 0) n = "SIG" + n;
      if (n == "SIGUSR1") {
        o.forward_sigusr1 = true;
      } else if (n == "SIGUSR2") {
        o.forward_sigusr2 = true;
      } else if (n != "SIGTERM" && n != "SIGINT" && n != "SIGHUP" && n != "SIGQUIT") {
        return UsageError(absl::StrCat("--signals_to_handle: '", std::string(name),
                                       "' is not a signal ddprun forwards; use SIGTERM, SIGINT, "
                                       "SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2"));
      }
    }
  }

  // Compatibility flags: validated, stored, unused.
  {
    auto m = ParseSeconds(flags.Get("monitor_interval", "0.1"), "--monitor_interval",
                          /*allow_zero=*/true);
    if (!m.ok()) return m.status();
    out.launcher.monitor_interval_s = *m;
    Setting sm = flags.Get("start_method", "spawn");
    if (sm.value != "spawn" && sm.value != "fork" && sm.value != "forkserver") {
      return UsageError(absl::StrCat(sm.Name("--start_method"),
                                     " must be spawn, fork or forkserver, got '", sm.value, "'"));
    }
    out.launcher.start_method = sm.value;
  }

  // Output.
  o.log_dir = flags.Get("log_dir", "").value;
  {
    auto r = ParseStdStreams(flags.Get("redirects", "0"), "--redirects");
    if (!r.ok()) return r.status();
    out.launcher.redirects = *r;
    auto t = ParseStdStreams(flags.Get("tee", "0"), "--tee");
    if (!t.ok()) return t.status();
    out.launcher.tee = *t;
    auto f = ParseRankList(flags.Get("local_ranks_filter", ""), o.nproc_per_node);
    if (!f.ok()) return f.status();
    out.launcher.local_ranks_filter = *f;
    o.logs.redirects = out.launcher.redirects;
    o.logs.tee = out.launcher.tee;
    o.logs.local_ranks_filter = out.launcher.local_ranks_filter;
    auto prefix = flags.GetBool("prefix_output");
    if (!prefix.ok()) return prefix.status();
    o.logs.prefix_output = *prefix;
    auto tail = ParseIntIn(flags.Get("stderr_tail_lines", "20"), "--stderr_tail_lines", 0, 10'000,
                           "a number of lines in 0..10000");
    if (!tail.ok()) return tail.status();
    o.logs.stderr_tail_lines = *tail;
  }

  // Rendezvous.
  Setting backend = flags.Get("rdzv_backend", "c10d");
  Setting endpoint = flags.Get("rdzv_endpoint", "");
  Setting rdzv_id = flags.Get("rdzv_id", "none");
  Setting node_rank = flags.Get("node_rank", "0");
  Setting master_addr = flags.Get("master_addr", o.master_addr);
  Setting master_port = flags.Get("master_port", std::to_string(o.master_port));
  o.local_addr = flags.Get("local_addr", "").value;

  const std::string backend_name = absl::AsciiStrToLower(backend.value);
  if (backend_name == "etcd" || backend_name == "etcd-v2") {
    return UsageError(absl::StrCat(backend.Name("--rdzv_backend"), "=", backend.value,
                                   " is not supported; use c10d (ddprund or single node) or "
                                   "static"));
  }
  if (backend_name != "c10d" && backend_name != "ddprun" && backend_name != "static") {
    return UsageError(absl::StrCat(backend.Name("--rdzv_backend"),
                                   " must be c10d (alias ddprun) or static, got '", backend.value,
                                   "'"));
  }
  const bool is_static = backend_name == "static" && !*standalone;
  if (job) {
    // The file's --rdzv_conf keys first; a --rdzv_conf flag or PET_RDZV_CONF
    // then overrides the keys it names.
    std::vector<std::string> file_conf;
    for (const char* key : {"join_timeout", "last_call_timeout", "token"}) {
      if (const Setting* f = flags.File(absl::StrCat("rdzv_conf.", key))) {
        file_conf.push_back(absl::StrCat(key, "=", f->value));
      }
    }
    const Setting file_setting{absl::StrJoin(file_conf, ","), job->path + ": rendezvous",
                               Origin::kFile};
    if (auto s = ParseRdzvConf(file_setting, is_static, o, warnings); !s.ok()) return s;
  }
  if (auto s = ParseRdzvConf(flags.Get("rdzv_conf", ""), is_static, o, warnings); !s.ok()) {
    return s;
  }
  if (node_rank.is_set()) {
    auto r =
        ParseIntIn(node_rank, "--node_rank", 0, o.max_nodes - 1,
                   absl::StrCat("in 0..", o.max_nodes - 1, " (--nnodes max is ", o.max_nodes, ")"));
    if (!r.ok()) return r.status();
    o.node_rank = *r;
  }

  if (*standalone) {
    std::vector<std::string> ignored;
    for (auto* s : {&backend, &endpoint, &rdzv_id}) {
      if (absl::StartsWith(s->source, "--")) ignored.push_back(s->source);
    }
    if (!ignored.empty()) {
      warnings.push_back(
          absl::StrCat("ddprun: --standalone ignores ", absl::StrJoin(ignored, ", ")));
    }
    if (o.max_nodes > 1) {
      return UsageError(absl::StrCat("--standalone runs a single node but --nnodes is ",
                                     o.min_nodes == o.max_nodes
                                         ? std::to_string(o.max_nodes)
                                         : absl::StrCat(o.min_nodes, ":", o.max_nodes),
                                     "; drop --standalone and pass --rdzv_endpoint"));
    }
    o.mode = RendezvousMode::kEmbedded;
    o.job_id = RandomJobId();
    o.rdzv_host = "127.0.0.1";
    o.rdzv_port = 0;
  } else if (is_static) {
    if (o.min_nodes != o.max_nodes) {
      return UsageError(absl::StrCat(
          "--rdzv_backend=static needs a fixed number of nodes but "
          "--nnodes is ",
          o.min_nodes, ":", o.max_nodes, "; pass --nnodes=N, or use c10d for an elastic job"));
    }
    o.mode = RendezvousMode::kStatic;
    o.job_id = rdzv_id.value;
    if (!node_rank.is_set()) o.node_rank = 0;
    if (endpoint.is_set()) {
      // torchrun: with static, --rdzv_endpoint replaces --master_addr/--master_port.
      auto hp = ParseEndpoint(endpoint, "--rdzv_endpoint", /*default_port=*/-1);
      if (!hp.ok()) return hp.status();
      if (absl::StartsWith(master_addr.source, "--") ||
          absl::StartsWith(master_port.source, "--")) {
        warnings.push_back(
            "ddprun: --rdzv_endpoint overrides --master_addr/--master_port with the static "
            "backend");
      }
      o.master_addr = hp->host;
      o.master_port = hp->port;
    } else {
      if (master_addr.value.empty()) return UsageError("--master_addr must not be empty");
      o.master_addr = master_addr.value;
      auto p = ParseIntIn(master_port, "--master_port", 1, kMaxPort, "a port in 1..65535");
      if (!p.ok()) return p.status();
      o.master_port = *p;
    }
  } else {
    if (absl::StartsWith(master_addr.source, "--") || absl::StartsWith(master_port.source, "--")) {
      warnings.push_back(
          "ddprun: --master_addr/--master_port are only used with --rdzv_backend=static; "
          "ignored");
    }
    if (endpoint.is_set()) {
      auto hp = ParseEndpoint(endpoint, "--rdzv_endpoint", kDefaultRendezvousPort);
      if (!hp.ok()) return hp.status();
      o.mode = RendezvousMode::kRemote;
      o.rdzv_host = hp->host;
      o.rdzv_port = hp->port;
      o.job_id = rdzv_id.value;
    } else {
      if (o.max_nodes > 1) {
        return UsageError(absl::StrCat(
            "--nnodes=",
            o.min_nodes == o.max_nodes ? std::to_string(o.max_nodes)
                                       : absl::StrCat(o.min_nodes, ":", o.max_nodes),
            " needs a rendezvous shared by the nodes: start ddprund on one host and pass "
            "--rdzv_endpoint=HOST:29400 to every node (or use --rdzv_backend=static)"));
      }
      o.mode = RendezvousMode::kEmbedded;
      o.rdzv_host = "127.0.0.1";
      o.rdzv_port = 0;
      o.job_id = rdzv_id.is_set() ? rdzv_id.value : RandomJobId();
    }
  }
  if (o.job_id.empty()) return UsageError("--rdzv_id must not be empty");

  // Worker command.
  ScriptSpec spec;
  spec.script = rest[0];
  spec.args.assign(rest.begin() + 1, rest.end());
  spec.module = *module;
  spec.no_python = *no_python;
  auto command = BuildWorkerCommand(spec, env, &warnings);
  if (!command.ok()) return command.status();
  o.command = std::move(*command);

  if (job) {
    // nccl: and environment.set: go to every worker, unless the node's own
    // environment already sets the variable (env > file).
    for (const auto* list : {&job->nccl, &job->env_set}) {
      for (const auto& [name, value] : *list) {
        if (auto it = env.find(name); it != env.end() && !it->second.empty()) continue;
        o.extra_env[name] = value.text;
      }
    }
    for (const FileValue& pass : job->env_pass) {
      if (auto it = env.find(pass.text); it == env.end()) {
        warnings.push_back(absl::StrCat("ddprun: ", pass.Source(), ": ", pass.text,
                                        " is not set on this node, so workers do not get it"));
      }
    }
  }
  auto print_config = flags.GetBool("print_config");
  if (!print_config.ok()) return print_config.status();
  if (*print_config) {
    MergedJobView view;
    view.options = &o;
    view.job = job ? &*job : nullptr;
    view.lookup = [&flags](const std::string& dest) { return flags.Get(dest, ""); };
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
  std::vector<std::string> args(argv, argv + argc);
  return ParseCommandLine(args, env, host);
}

}  // namespace ddprun::launcher
