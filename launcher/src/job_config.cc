// The job file: YAML (yaml-cpp, which keeps each node's line and column)
// into a validated JobConfig. Every check names the position and key path.
// The keys and the value checks come from the knob table (knobs.h) and its
// parsers (value_parsers.h); this file adds the file's own structures
// (nodes.hosts, command, environment, nccl, scheduler) and cross-key checks.
#include "ddprun/launcher/job_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/suggest.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace ddprun::launcher {
namespace {

const char* const kExample = "see configs/ and docs/config.md";

// The keys a mapping may hold, in table order: the first segments of every
// YAML key for the top level (section ""), else the keys under `section`.
std::vector<std::string> KeysUnder(const std::string& section) {
  std::vector<std::string> keys;
  for (const Knob& k : kKnobs) {
    if (k.yaml_key == nullptr) continue;
    const std::string key = k.yaml_key;
    std::string name;
    if (section.empty()) {
      name = key.substr(0, key.find('.'));
    } else if (absl::StartsWith(key, section + ".")) {
      name = key.substr(section.size() + 1);
    } else {
      continue;
    }
    if (std::find(keys.begin(), keys.end(), name) == keys.end()) keys.push_back(name);
  }
  return keys;
}

const std::vector<std::string> kHostKeys = {"host", "slots"};

// Variables ddprun itself gives every worker: a file may not set them.
bool IsReservedName(const std::string& name) {
  static const std::set<std::string> kReserved = {
      "RANK",       "LOCAL_RANK",      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",  "ROLE_WORLD_SIZE",  "MASTER_ADDR",
      "MASTER_PORT"};
  return kReserved.count(name) > 0 || absl::StartsWith(name, "TORCHELASTIC_") ||
         absl::StartsWith(name, "DDPRUN_");
}

bool IsEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

const char* KindName(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "empty";
    default:
      return "a value";
  }
}

// Walks the document with the file name and the current key path.
// yaml-cpp 0.7's LoadAll loops forever, allocating until the memory runs
// out, when a document starts with a token that cannot start a node (a lone
// ",", or `"a":b` followed by a line `? c`): the parser reports an empty
// document without consuming the token, again and again (fixed upstream by
// yaml-cpp PR #1319, not in Debian's 0.7.0). Walks the documents with the
// same parser first and returns where it would loop: two documents starting
// at the same place, which otherwise never happens (each consumes a token).
std::optional<YAML::Mark> LoadAllWouldLoop(const std::string& text) {
  struct DocumentStarts : YAML::EventHandler {
    void OnDocumentStart(const YAML::Mark& mark) override {
      stuck = started && mark.pos == last.pos;
      started = true;
      last = mark;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
    bool started = false;
    bool stuck = false;
    YAML::Mark last;
  } starts;
  std::istringstream in(text);
  YAML::Parser parser(in);
  while (parser.HandleNextDocument(starts)) {
    if (starts.stuck) return starts.last;
  }
  return std::nullopt;
}

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) { job_.path = path_; }

  std::string Where(const YAML::Mark& m) const {
    if (m.is_null()) return path_;
    return absl::StrCat(path_, ":", m.line + 1, ":", m.column + 1);
  }

  absl::Status Error(const YAML::Node& at, const std::string& key, const std::string& problem,
                     const std::string& fix) const {
    return ErrorAt(at.Mark(), key, problem, fix);
  }
  absl::Status ErrorAt(const YAML::Mark& m, const std::string& key, const std::string& problem,
                       const std::string& fix) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(m), ": ", key, ": ", problem, "; ", fix));
  }

  // Checks that `node` is a mapping whose keys are all in `known`, each once.
  absl::Status CheckMap(const YAML::Node& node, const std::string& key,
                        const std::vector<std::string>& known) const {
    if (!node.IsMap()) {
      return Error(node, key, absl::StrCat("must be a mapping of keys, got ", KindName(node)),
                   absl::StrCat("write its keys (", absl::StrJoin(known, ", "), ") indented below it"));
    }
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const YAML::Node& k = kv.first;
      const std::string path = key.empty() ? "" : key + ".";
      if (!k.IsScalar()) {
        return Error(k, key.empty() ? "(top level)" : key, "a key must be a plain name",
                     absl::StrCat("use one of ", absl::StrJoin(known, ", ")));
      }
      const std::string name = k.Scalar();
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        return Error(k, path + name, "unknown key" + DidYouMean(name, known),
                     absl::StrCat("valid keys here are ", absl::StrJoin(known, ", ")));
      }
      if (!seen.insert(name).second) {
        return Error(k, path + name, "duplicate key", "keep one of them");
      }
    }
    return absl::OkStatus();
  }

  static std::string DidYouMean(const std::string& name, const std::vector<std::string>& known) {
    return rendezvous::DidYouMean(absl::AsciiStrToLower(name), known, "'");
  }

  // A scalar value: not a list, a mapping or empty.
  absl::StatusOr<std::string> Scalar(const YAML::Node& n, const std::string& key,
                                     const std::string& fix) const {
    if (n.IsNull()) return Error(n, key, "has no value", fix);
    if (!n.IsScalar()) {
      return Error(n, key, absl::StrCat("must be a single value, got ", KindName(n)), fix);
    }
    return n.Scalar();
  }

  void Store(const std::string& key, const YAML::Node& n, std::string text) {
    job_.values[key] = FileValue{std::move(text), Where(n.Mark()), key};
  }

  // "FILE:LINE:COL: key: <problem and fix>", the text its flag's parser gives.
  absl::Status ValueError(const YAML::Node& at, const std::string& key,
                          const absl::Status& problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(at.Mark()), ": ", key, ": ", problem.message()));
  }

  // A knob's value: the YAML forms of a list or a map become the flag's text
  // ([0, 1] -> "0,1", {0: 3, 1: 2} -> "0:3,1:2"), then the flag's parser
  // checks and normalises it.
  absl::Status Value(const YAML::Node& n, const Knob& k) {
    const std::string key = k.yaml_key;
    const std::string fix = k.type == ValueType::kBool
                                ? std::string("write true or false")
                                : absl::StrCat("write one value: ", k.metavar ? k.metavar : "text");
    std::string text;
    if (k.type == ValueType::kStreams && n.IsMap()) {
      std::vector<std::string> parts;
      for (const auto& kv : n) {
        DDPRUN_ASSIGN_OR_RETURN(std::string rank, Scalar(kv.first, key, fix));
        DDPRUN_ASSIGN_OR_RETURN(std::string v, Scalar(kv.second, absl::StrCat(key, ".", rank), fix));
        parts.push_back(absl::StrCat(rank, ":", v));
      }
      text = absl::StrJoin(parts, ",");
    } else if (k.type == ValueType::kEndpoint && n.IsSequence()) {
      // ddprund replicas (docs/ha.md): rdzv.endpoint: [d1:29400, d2:29400, d3:29400]
      if (n.size() == 0) return Error(n, key, "is an empty list", "write HOST:PORT of each ddprund replica");
      std::vector<std::string> items;
      for (const auto& item : n) {
        DDPRUN_ASSIGN_OR_RETURN(std::string s, Scalar(item, key, fix));
        items.push_back(s);
      }
      text = absl::StrJoin(items, ",");
    } else if (k.type == ValueType::kRankList && n.IsSequence()) {
      if (n.size() == 0) return Error(n, key, "is an empty list", "write local ranks, e.g. [0] or [0, 1]");
      std::vector<std::string> items;
      for (const auto& item : n) {
        DDPRUN_ASSIGN_OR_RETURN(std::string s, Scalar(item, key, fix));
        items.push_back(s);
      }
      text = absl::StrJoin(items, ",");
    } else {
      DDPRUN_ASSIGN_OR_RETURN(text, Scalar(n, key, fix));
    }
    auto normalized = NormalizeKnobValue(k, text);
    if (!normalized.ok()) return ValueError(n, key, normalized.status());
    Store(key, n, *normalized);
    return absl::OkStatus();
  }

  // The knobs of a section ("rendezvous", "restart", "logs"), in table order.
  absl::Status Section(const YAML::Node& n, const std::string& section) {
    DDPRUN_RETURN_IF_ERROR(CheckMap(n, section, KeysUnder(section)));
    for (const std::string& name : KeysUnder(section)) {
      if (!n[name]) continue;
      DDPRUN_RETURN_IF_ERROR(Value(n[name], *FindYamlKnob(absl::StrCat(section, ".", name))));
    }
    return absl::OkStatus();
  }

  absl::Status Job(const YAML::Node& n) {
    DDPRUN_RETURN_IF_ERROR(CheckMap(n, "job", KeysUnder("job")));
    if (n["id"]) DDPRUN_RETURN_IF_ERROR(Value(n["id"], *FindYamlKnob("job.id")));
    if (n["name"]) {
      DDPRUN_ASSIGN_OR_RETURN(job_.name, Scalar(n["name"], "job.name", "write a display name"));
    }
    return absl::OkStatus();
  }

  absl::Status Host(const YAML::Node& n, std::size_t i) {
    const std::string key = absl::StrCat("nodes.hosts[", i, "]");
    const std::string fix = "write a host name or address, 'HOST slots=N' or {host: HOST, slots: N}";
    HostEntry e;
    e.location = Where(n.Mark());
    YAML::Mark slots_mark = n.Mark();
    std::string slots_text;
    if (n.IsMap()) {
      DDPRUN_RETURN_IF_ERROR(CheckMap(n, key, kHostKeys));
      if (!n["host"]) return Error(n, key + ".host", "is missing", fix);
      DDPRUN_ASSIGN_OR_RETURN(e.host, Scalar(n["host"], key + ".host", fix));
      if (n["slots"]) {
        DDPRUN_ASSIGN_OR_RETURN(slots_text, Scalar(n["slots"], key + ".slots", "write the number of workers on this host"));
        slots_mark = n["slots"].Mark();
        if (slots_text.empty()) slots_text = "?";
      }
    } else {
      DDPRUN_ASSIGN_OR_RETURN(const std::string s, Scalar(n, key, fix));
      // DeepSpeed/Horovod hostfile style: "host slots=N".
      std::vector<std::string> words = absl::StrSplit(s, ' ', absl::SkipWhitespace());
      if (words.empty()) return Error(n, key, "is empty", fix);
      e.host = words[0];
      for (std::size_t w = 1; w < words.size(); ++w) {
        if (!absl::StartsWith(words[w], "slots=") || !slots_text.empty()) {
          return Error(n, key, absl::StrCat("'", s, "' is not 'HOST slots=N'"), fix);
        }
        slots_text = words[w].substr(6);
        if (slots_text.empty()) slots_text = "?";
      }
    }
    if (e.host.empty()) return Error(n, key, "the host is empty", fix);
    if (e.host.find_first_of(" \t,[]") != std::string::npos) {
      return Error(n, key, absl::StrCat("'", e.host, "' is not a host name or address"), fix);
    }
    if (!slots_text.empty()) {
      auto v = ParseCount(slots_text, 1, 100000, "a positive integer");
      if (!v.ok()) {
        return ErrorAt(slots_mark, key + ".slots",
                     absl::StrCat("must be a positive integer, got '", slots_text, "'"),
                     "write the number of workers on this host, e.g. slots: 4");
      }
      e.slots = static_cast<int>(*v);
    }
    for (const HostEntry& other : job_.hosts) {
      if (absl::AsciiStrToLower(other.host) == absl::AsciiStrToLower(e.host)) {
        return Error(n, key, absl::StrCat("duplicate host '", e.host, "' (also at ", other.location, ")"),
                     "list each host once; slots sets its number of workers");
      }
    }
    job_.hosts.push_back(std::move(e));
    return absl::OkStatus();
  }

  absl::Status Hosts(const YAML::Node& n) {
    if (!n.IsSequence()) {
      return Error(n, "nodes.hosts", absl::StrCat("must be a list of hosts, got ", KindName(n)),
                   "write one '- HOST' (or '- HOST slots=N') line per node");
    }
    if (n.size() == 0) {
      return Error(n, "nodes.hosts", "is an empty list", "list at least one host, or drop the key");
    }
    job_.hosts_location = Where(n.Mark());
    for (std::size_t i = 0; i < n.size(); ++i) {
      DDPRUN_RETURN_IF_ERROR(Host(n[i], i));
    }
    return absl::OkStatus();
  }

  absl::Status Nodes(const YAML::Node& n) {
    if (n.IsSequence()) return Hosts(n);
    const Knob& count = *FindYamlKnob("nodes.count");
    if (n.IsScalar()) return Value(n, count);
    DDPRUN_RETURN_IF_ERROR(CheckMap(n, "nodes", KeysUnder("nodes")));
    if (n["count"]) DDPRUN_RETURN_IF_ERROR(Value(n["count"], count));
    if (n["hosts"]) DDPRUN_RETURN_IF_ERROR(Hosts(n["hosts"]));
    return absl::OkStatus();
  }

  absl::Status Command(const YAML::Node& root) {
    const std::string fix =
        "write the script and its arguments: command: train.py, or command: [train.py, --epochs, 3]";
    if (const YAML::Node n = root["command"]) {
      job_.command_location = Where(n.Mark());
      if (n.IsSequence()) {
        if (n.size() == 0) return Error(n, "command", "is an empty list", fix);
        for (std::size_t i = 0; i < n.size(); ++i) {
          DDPRUN_ASSIGN_OR_RETURN(std::string s, Scalar(n[i], absl::StrCat("command[", i, "]"), fix));
          job_.command.push_back(std::move(s));
        }
      } else {
        DDPRUN_ASSIGN_OR_RETURN(std::string s, Scalar(n, "command", fix));
        job_.command.push_back(std::move(s));
      }
      if (job_.command[0].empty()) return Error(n, "command", "the script is empty", fix);
    }
    if (const YAML::Node a = root["args"]) {
      if (!root["command"]) {
        return Error(a, "args", "is given without command", "add command: SCRIPT above it");
      }
      if (!a.IsSequence()) {
        return Error(a, "args", absl::StrCat("must be a list, got ", KindName(a)),
                     "write args: [--epochs, 3]");
      }
      for (std::size_t i = 0; i < a.size(); ++i) {
        DDPRUN_ASSIGN_OR_RETURN(std::string s,
                                Scalar(a[i], absl::StrCat("args[", i, "]"), "write each argument as a value"));
        job_.command.push_back(std::move(s));
      }
    }
    return absl::OkStatus();
  }

  absl::Status EnvName(const YAML::Node& at, const std::string& key, const std::string& name) {
    if (!IsEnvName(name)) {
      return Error(at, key, absl::StrCat("'", name, "' is not a variable name"),
                   "use letters, digits and '_', not starting with a digit");
    }
    if (IsReservedName(name)) {
      return Error(at, key, absl::StrCat(name, " is set by ddprun for every worker"),
                   "remove it; ddprun gives each worker its own value");
    }
    if (!seen_vars_.insert(name).second) {
      return Error(at, key, absl::StrCat(name, " is given twice"), "keep one of them");
    }
    return absl::OkStatus();
  }

  absl::Status Environment(const YAML::Node& n) {
    DDPRUN_RETURN_IF_ERROR(CheckMap(n, "environment", KeysUnder("environment")));
    if (const YAML::Node set = n["set"]) {
      if (!set.IsMap()) {
        return Error(set, "environment.set", absl::StrCat("must be a mapping, got ", KindName(set)),
                     "write NAME: value lines indented below it");
      }
      for (const auto& kv : set) {
        DDPRUN_ASSIGN_OR_RETURN(const std::string name,
                                Scalar(kv.first, "environment.set", "write NAME: value"));
        const std::string key = "environment.set." + name;
        DDPRUN_RETURN_IF_ERROR(EnvName(kv.first, key, name));
        std::string value;
        if (!kv.second.IsNull()) {
          DDPRUN_ASSIGN_OR_RETURN(value, Scalar(kv.second, key, "write a single value (quote it if needed)"));
        }
        job_.env_set.emplace_back(name, FileValue{value, Where(kv.second.Mark()), key});
      }
    }
    if (const YAML::Node pass = n["pass"]) {
      if (!pass.IsSequence()) {
        return Error(pass, "environment.pass", absl::StrCat("must be a list of names, got ", KindName(pass)),
                     "write pass: [HF_HOME, WANDB_API_KEY]");
      }
      for (std::size_t i = 0; i < pass.size(); ++i) {
        const std::string key = absl::StrCat("environment.pass[", i, "]");
        DDPRUN_ASSIGN_OR_RETURN(const std::string name, Scalar(pass[i], key, "write a variable name"));
        DDPRUN_RETURN_IF_ERROR(EnvName(pass[i], key, name));
        job_.env_pass.push_back(FileValue{name, Where(pass[i].Mark()), key});
      }
    }
    return absl::OkStatus();
  }

  absl::Status Nccl(const YAML::Node& n) {
    if (!n.IsMap()) {
      return Error(n, "nccl", absl::StrCat("must be a mapping, got ", KindName(n)),
                   "write settings such as socket_ifname: eth0 indented below it");
    }
    std::vector<std::string> names;
    for (const NcclKey& k : kNcclKeys) names.push_back(k.key);
    for (const auto& kv : n) {
      DDPRUN_ASSIGN_OR_RETURN(const std::string name, Scalar(kv.first, "nccl", "write setting: value"));
      const std::string* key_text = &name;
      const std::string key = "nccl." + *key_text;
      std::string var;
      for (const NcclKey& k : kNcclKeys)
        if (*key_text == k.key) var = k.env;
      if (var.empty() && absl::StartsWith(*key_text, "NCCL_") && key_text->size() > 5 &&
          IsEnvName(*key_text)) {
        var = *key_text;
      }
      if (var.empty()) {
        std::string upper = absl::AsciiStrToUpper(*key_text);
        if (!absl::StartsWith(upper, "NCCL_")) upper = "NCCL_" + upper;
        return Error(kv.first, key, "unknown NCCL setting" + DidYouMean(*key_text, names),
                     absl::StrCat("use ", absl::StrJoin(names, ", "),
                                  ", or an NCCL variable verbatim (e.g. ", upper, ")"));
      }
      if (!seen_vars_.insert(var).second) {
        return Error(kv.first, key, absl::StrCat(var, " is given twice"), "keep one of them");
      }
      DDPRUN_ASSIGN_OR_RETURN(std::string text, Scalar(kv.second, key, "write a single value"));
      if (var == "NCCL_P2P_DISABLE" || var == "NCCL_SHM_DISABLE") {
        auto b = ParseBool(text);
        if (!b.ok()) {
          return Error(kv.second, key, absl::StrCat("must be true or false, got '", text, "'"),
                       "write true (disable) or false");
        }
        text = *b ? "1" : "0";
      } else if (var == "NCCL_BUFFSIZE") {
        if (!ParseCount(text, 1, std::numeric_limits<long>::max(), "").ok()) {
          return Error(kv.second, key, absl::StrCat("must be a positive number of bytes, got '", text, "'"),
                       "write e.g. 4194304 (4 MiB, NCCL's default)");
        }
      } else if (var == "NCCL_DEBUG") {
        const std::string u = absl::AsciiStrToUpper(text);
        if (u != "VERSION" && u != "WARN" && u != "INFO" && u != "TRACE" && u != "ABORT") {
          return Error(kv.second, key, absl::StrCat("must be VERSION, WARN, INFO or TRACE, got '", text, "'"),
                       "write e.g. debug: WARN");
        }
        text = u;
      } else if (text.empty()) {
        return Error(kv.second, key, "is empty", "write a value or remove the key");
      }
      job_.nccl.emplace_back(var, FileValue{text, Where(kv.second.Mark()), key});
    }
    return absl::OkStatus();
  }

  // The scheduler: key is the --scheduler knob; its mode is kept for placement.
  absl::Status Scheduler(const YAML::Node& n) {
    DDPRUN_RETURN_IF_ERROR(Value(n, *FindYamlKnob("scheduler")));
    job_.scheduler = SchedulerModeNamed(job_.values.at("scheduler").text);
    job_.scheduler_location = Where(n.Mark());
    return absl::OkStatus();
  }

  // Checks that span several keys.
  absl::Status CrossChecks(const YAML::Node& root) {
    const YAML::Node nodes = root["nodes"];
    if (!job_.hosts.empty()) {
      // Every node runs the same number of workers (the rendezvous refuses a
      // node that disagrees), so slots must agree with each other and nproc.
      const HostEntry* first = nullptr;
      for (const HostEntry& h : job_.hosts) {
        if (h.slots == 0) continue;
        if (first == nullptr) {
          first = &h;
        } else if (h.slots != first->slots) {
          return absl::InvalidArgumentError(absl::StrCat(
              h.location, ": nodes.hosts: host '", h.host, "' has slots=", h.slots, " but '",
              first->host, "' has slots=", first->slots,
              "; give every host the same slots (ddprun runs the same number of workers per node)"));
        }
      }
      auto np = job_.values.find("nproc_per_node");
      if (first != nullptr && np != job_.values.end()) {
        auto v = ParseNproc(np->second.text);
        if (v.ok() && v->kind == NprocSpec::Kind::kNumber && v->number != first->slots) {
          return absl::InvalidArgumentError(absl::StrCat(
              np->second.location, ": nproc_per_node: is ", v->number, " but the hosts have slots=",
              first->slots, " (", first->location, "); make them agree or drop one of them"));
        }
      }
      auto count = job_.values.find("nodes.count");
      if (count != job_.values.end()) {
        auto range = ParseNodeRange(count->second.text);
        const long long lo = range.ok() ? range->min : 0;
        if (lo > static_cast<long long>(job_.hosts.size())) {
          return absl::InvalidArgumentError(absl::StrCat(
              count->second.location, ": nodes.count: needs at least ", lo, " nodes but nodes.hosts lists ",
              job_.hosts.size(), "; list more hosts or lower the minimum"));
        }
      }
    }
    (void)nodes;
    auto backend = job_.values.find("rendezvous.backend");
    auto count = job_.values.find("nodes.count");
    if (backend != job_.values.end() && backend->second.text == "static" &&
        count != job_.values.end() && count->second.text.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          count->second.location, ": nodes.count: static rendezvous needs a fixed count, got ",
          count->second.text, "; write one number, or use backend: c10d for an elastic job"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<JobConfig> Parse(const std::string& text) {
    // Tabs: YAML forbids them in indentation, and yaml-cpp's message for them
    // is obscure; name the line.
    {
      std::size_t line = 1, col = 1;
      bool leading = true;
      for (char c : text) {
        if (c == '\n') {
          ++line;
          col = 1;
          leading = true;
          continue;
        }
        if (c == '\t' && leading) {
          return absl::InvalidArgumentError(absl::StrCat(
              path_, ":", line, ":", col, ": (indentation): a tab character; indent with spaces"));
        }
        if (c != ' ') leading = false;
        ++col;
      }
    }
    std::vector<YAML::Node> docs;
    try {
      if (std::optional<YAML::Mark> at = LoadAllWouldLoop(text)) {
        const char c = at->pos >= 0 && static_cast<std::size_t>(at->pos) < text.size()
                           ? text[at->pos] : ' ';
        return ErrorAt(*at, "(syntax)",
                       std::isgraph(static_cast<unsigned char>(c))
                           ? absl::StrCat("'", std::string(1, c), "' cannot start a value here")
                           : std::string("a value cannot start here"),
                       "fix the YAML syntax");
      }
      docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      return ErrorAt(e.mark, "(syntax)", e.msg, "fix the YAML syntax");
    }
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(docs[1].Mark()), ": (document): a second YAML document ('---'); keep one job per file"));
    }
    if (docs.empty() || docs[0].IsNull()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ":1:1: (top level): the file has no settings; describe the job as a mapping, ", kExample));
    }
    const YAML::Node root = docs[0];
    if (!root.IsMap()) {
      return Error(root, "(top level)", absl::StrCat("must be a mapping of keys, got ", KindName(root)),
                   absl::StrCat("write key: value lines such as nproc_per_node: 4, ", kExample));
    }
    DDPRUN_RETURN_IF_ERROR(CheckMap(root, "", KeysUnder("")));
    try {
      // Top-level keys in table order: a knob's value, a section of knobs,
      // or one of the file's own structures.
      for (const std::string& name : KeysUnder("")) {
        const YAML::Node n = root[name];
        if (name == "command") {
          DDPRUN_RETURN_IF_ERROR(Command(root));  // also reads args
        } else if (!n || name == "args") {
          continue;
        } else if (name == "nodes") {
          DDPRUN_RETURN_IF_ERROR(Nodes(n));
        } else if (name == "scheduler") {
          DDPRUN_RETURN_IF_ERROR(Scheduler(n));
        } else if (name == "job") {
          DDPRUN_RETURN_IF_ERROR(Job(n));
        } else if (name == "environment") {
          DDPRUN_RETURN_IF_ERROR(Environment(n));
        } else if (name == "nccl") {
          DDPRUN_RETURN_IF_ERROR(Nccl(n));
        } else if (const Knob* k = FindYamlKnob(name)) {
          DDPRUN_RETURN_IF_ERROR(Value(n, *k));
        } else {
          DDPRUN_RETURN_IF_ERROR(Section(n, name));
        }
      }
      DDPRUN_RETURN_IF_ERROR(CrossChecks(root));
    } catch (const YAML::Exception& e) {
      return ErrorAt(e.mark, "(yaml)", e.msg, "fix the YAML");
    }
    auto m = job_.values.find("module");
    auto np = job_.values.find("no_python");
    if (m != job_.values.end() && np != job_.values.end() && m->second.text == "true" &&
        np->second.text == "true") {
      return absl::InvalidArgumentError(
          absl::StrCat(np->second.location, ": no_python: cannot be combined with module: true; drop one"));
    }
    return std::move(job_);
  }

 private:
  std::string path_;
  JobConfig job_;
  std::set<std::string> seen_vars_;  // environment and NCCL variables, once each
};

}  // namespace

SchedulerMode SchedulerModeNamed(absl::string_view name) {
  if (name == "slurm") return SchedulerMode::kSlurm;
  if (name == "mpi") return SchedulerMode::kMpi;
  if (name == "none") return SchedulerMode::kNone;
  return SchedulerMode::kAuto;
}

const char* OriginName(Origin origin) {
  switch (origin) {
    case Origin::kDefault:
      return "default";
    case Origin::kFlag:
      return "flag";
    case Origin::kEnv:
      return "env";
    case Origin::kFile:
      return "file";
    case Origin::kScheduler:
      return "scheduler";
    case Origin::kHost:
      return "host";
  }
  return "?";
}

std::string KnobValue::Name(const std::string& flag) const {
  if (source.empty() || absl::StartsWith(source, "--")) return flag;
  return absl::StrCat(source, " (", flag, ")");
}

std::map<std::string, KnobValue> JobConfig::FlagValues() const {
  std::map<std::string, KnobValue> out;
  auto file = [](const FileValue& v) { return KnobValue{v.text, v.Source(), Origin::kFile}; };
  for (const Knob& k : kKnobs) {
    if (k.yaml_key == nullptr || k.type == ValueType::kFileOnly) continue;
    auto it = values.find(k.yaml_key);
    if (it == values.end()) continue;
    out[k.Dest()] = file(it->second);
  }
  if (!hosts.empty()) {
    if (out.count("nnodes") == 0) {
      out["nnodes"] = KnobValue{std::to_string(hosts.size()),
                                absl::StrCat(hosts_location, ": nodes.hosts"), Origin::kFile};
    }
    if (out.count("nproc_per_node") == 0) {
      for (const HostEntry& h : hosts) {
        if (h.slots > 0) {
          out["nproc_per_node"] =
              KnobValue{std::to_string(h.slots), absl::StrCat(h.location, ": nodes.hosts slots"),
                        Origin::kFile};
          break;
        }
      }
    }
  }
  return out;
}

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& path) {
  return Parser(path).Parse(text);
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  auto fail = [&](const std::string& problem, const std::string& fix) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem, "; ", fix));
  };
  if (path.empty()) return fail("the config path is empty", "pass --config FILE");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return fail(absl::StrCat("cannot read the config file: ", std::strerror(err)),
                err == ENOENT ? "check the --config path" : "check its permissions");
  }
  if (S_ISDIR(st.st_mode)) return fail("is a directory, not a config file", "pass the YAML file");
  if (!S_ISREG(st.st_mode)) return fail("is not a regular file", "pass the YAML file");
  if (static_cast<std::size_t>(st.st_size) > kMaxConfigBytes) {
    return fail(absl::StrCat("is ", st.st_size, " bytes, over the ", kMaxConfigBytes,
                             "-byte limit for a job file"),
                "keep data out of it; a job file is a few hundred bytes");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return fail(absl::StrCat("cannot read the config file: ", std::strerror(errno)),
                "check its permissions");
  }
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    return fail(absl::StrCat("is over the ", kMaxConfigBytes, "-byte limit for a job file"),
                "keep data out of it; a job file is a few hundred bytes");
  }
  if (text.find('\0') != std::string::npos) {
    return fail("contains a NUL byte (binary data)", "pass the YAML job file");
  }
  return ParseJobConfig(text, path);
}

}  // namespace ddprun::launcher
