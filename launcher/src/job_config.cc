// The job file: YAML (yaml-cpp, which keeps each node's line and column)
// into a validated JobConfig. Every check names the position and key path.
#include "ddprun/launcher/job_config.h"
#include "parse_util.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "yaml-cpp/yaml.h"

namespace ddprun::launcher {
namespace {

const char* const kExample = "see configs/ and docs/config.md";

// The keys each mapping may hold.
const std::vector<std::string> kTopKeys = {
    "job",     "rendezvous", "nodes",     "scheduler", "nproc_per_node", "role",
    "command", "args",       "module",    "no_python", "restart",        "logs",
    "environment", "nccl"};
const std::vector<std::string> kJobKeys = {"id", "name"};
const std::vector<std::string> kRdzvKeys = {"backend", "endpoint", "token", "join_timeout",
                                            "last_call_timeout"};
const std::vector<std::string> kNodesKeys = {"count", "hosts"};
const std::vector<std::string> kHostKeys = {"host", "slots"};
const std::vector<std::string> kRestartKeys = {"max_restarts", "grace_period",
                                               "signals_to_handle"};
const std::vector<std::string> kLogsKeys = {"log_dir",           "redirects",     "tee",
                                            "local_ranks_filter", "prefix_output",
                                            "stderr_tail_lines"};
const std::vector<std::string> kEnvKeys = {"set", "pass"};

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

std::optional<bool> ToBool(const std::string& s) {
  const std::string l = absl::AsciiStrToLower(s);
  if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
  if (l == "false" || l == "no" || l == "off" || l == "0") return false;
  return std::nullopt;
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
    std::string best;
    std::size_t best_d = std::max<std::size_t>(3, name.size() / 3 + 1);
    for (const std::string& k : known) {
      const std::size_t d = KeyDistance(absl::AsciiStrToLower(name), k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    return best.empty() ? "" : absl::StrCat(" (did you mean '", best, "'?)");
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

  absl::Status String(const YAML::Node& n, const std::string& key, const std::string& fix) {
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    if (s->empty()) return Error(n, key, "is empty", fix);
    Store(key, n, *s);
    return absl::OkStatus();
  }

  absl::Status Int(const YAML::Node& n, const std::string& key, long long lo, long long hi,
                   const std::string& what) {
    const std::string fix = absl::StrCat("write ", what);
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    auto v = ParseInt(*s);
    if (!v) return Error(n, key, absl::StrCat("must be an integer, got '", *s, "'"), fix);
    if (*v < lo) return Error(n, key, absl::StrCat("must be >= ", lo, ", got ", *v), fix);
    if (*v > hi) return Error(n, key, absl::StrCat("must be <= ", hi, ", got ", *v), fix);
    Store(key, n, std::to_string(*v));
    return absl::OkStatus();
  }

  absl::Status Seconds(const YAML::Node& n, const std::string& key, bool allow_zero) {
    const std::string fix =
        allow_zero ? "write a number of seconds >= 0" : "write a number of seconds > 0";
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    auto v = ParseDouble(*s);
    if (!v) return Error(n, key, absl::StrCat("must be a number of seconds, got '", *s, "'"), fix);
    if (*v < 0 || (!allow_zero && *v == 0)) {
      return Error(n, key, absl::StrCat("must be ", allow_zero ? ">= 0" : "> 0", ", got ", *s), fix);
    }
    Store(key, n, *s);
    return absl::OkStatus();
  }

  absl::Status Bool(const YAML::Node& n, const std::string& key) {
    const std::string fix = "write true or false";
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    auto b = ToBool(*s);
    if (!b) return Error(n, key, absl::StrCat("must be true or false, got '", *s, "'"), fix);
    Store(key, n, *b ? "true" : "false");
    return absl::OkStatus();
  }

  // nnodes: N or MIN:MAX.
  absl::Status Count(const YAML::Node& n, const std::string& key) {
    const std::string fix = "write N or MIN:MAX with 0 < MIN <= MAX, e.g. 2 or 2:4";
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    const std::vector<std::string> parts = absl::StrSplit(*s, ':');
    if (parts.size() > 2) return Error(n, key, absl::StrCat("'", *s, "' has two ':'"), fix);
    auto lo = ParseInt(parts[0]);
    auto hi = parts.size() == 2 ? ParseInt(parts[1]) : lo;
    if (!lo || !hi) return Error(n, key, absl::StrCat("'", *s, "' is not N or MIN:MAX"), fix);
    if (*lo <= 0 || *hi <= 0) {
      return Error(n, key, absl::StrCat("node counts must be > 0, got '", *s, "'"), fix);
    }
    if (*lo > *hi) {
      return Error(n, key, absl::StrCat("min ", *lo, " is greater than max ", *hi), fix);
    }
    if (*hi > 100000) return Error(n, key, absl::StrCat("max ", *hi, " is too large"), fix);
    Store(key, n, *lo == *hi ? std::to_string(*lo) : absl::StrCat(*lo, ":", *hi));
    return absl::OkStatus();
  }

  // -r/-t: 0-3 for every rank, or a mapping/string of LOCAL_RANK:V.
  absl::Status Streams(const YAML::Node& n, const std::string& key) {
    const std::string fix = "write 0 (none), 1 (stdout), 2 (stderr), 3 (both), or {0: 3, 1: 2}";
    std::vector<std::pair<std::string, const YAML::Node*>> items;
    std::string text;
    if (n.IsMap()) {
      std::vector<std::string> parts;
      for (const auto& kv : n) {
        auto r = Scalar(kv.first, key, fix);
        if (!r.ok()) return r.status();
        auto rank = ParseInt(*r);
        if (!rank || *rank < 0) {
          return Error(kv.first, key, absl::StrCat("'", *r, "' is not a local rank"), fix);
        }
        auto v = Scalar(kv.second, absl::StrCat(key, ".", *r), fix);
        if (!v.ok()) return v.status();
        auto iv = ParseInt(*v);
        if (!iv || *iv < 0 || *iv > 3) {
          return Error(kv.second, absl::StrCat(key, ".", *r),
                       absl::StrCat("must be 0..3, got '", *v, "'"), fix);
        }
        parts.push_back(absl::StrCat(*rank, ":", *iv));
      }
      text = absl::StrJoin(parts, ",");
    } else {
      auto s = Scalar(n, key, fix);
      if (!s.ok()) return s.status();
      for (absl::string_view item : absl::StrSplit(*s, ',')) {
        const std::vector<std::string> rv = absl::StrSplit(item, ':');
        const std::string v = std::string(absl::StripAsciiWhitespace(rv.back()));
        auto iv = ParseInt(v);
        bool ok = rv.size() <= 2 && iv && *iv >= 0 && *iv <= 3;
        if (ok && rv.size() == 2) {
          auto r = ParseInt(std::string(absl::StripAsciiWhitespace(rv[0])));
          ok = r && *r >= 0;
        }
        if (!ok) return Error(n, key, absl::StrCat("'", *s, "' is not 0..3 or RANK:V,..."), fix);
      }
      text = *s;
    }
    Store(key, n, text);
    return absl::OkStatus();
  }

  absl::Status RankList(const YAML::Node& n, const std::string& key) {
    const std::string fix = "write a list of local ranks, e.g. [0] or [0, 1]";
    std::vector<std::string> ranks;
    auto add = [&](const YAML::Node& at, const std::string& s) -> absl::Status {
      auto r = ParseInt(std::string(absl::StripAsciiWhitespace(s)));
      if (!r || *r < 0) return Error(at, key, absl::StrCat("'", s, "' is not a local rank"), fix);
      ranks.push_back(std::to_string(*r));
      return absl::OkStatus();
    };
    if (n.IsSequence()) {
      if (n.size() == 0) return Error(n, key, "is an empty list", fix);
      for (const auto& item : n) {
        auto s = Scalar(item, key, fix);
        if (!s.ok()) return s.status();
        if (auto st = add(item, *s); !st.ok()) return st;
      }
    } else {
      auto s = Scalar(n, key, fix);
      if (!s.ok()) return s.status();
      for (absl::string_view item : absl::StrSplit(*s, ',')) {
        if (auto st = add(n, std::string(item)); !st.ok()) return st;
      }
    }
    Store(key, n, absl::StrJoin(ranks, ","));
    return absl::OkStatus();
  }

  absl::Status Endpoint(const YAML::Node& n, const std::string& key) {
    const std::string fix = "write HOST[:PORT] (ddprund) or first_node[:PORT] (node 0 hosts it)";
    auto s = Scalar(n, key, fix);
    if (!s.ok()) return s.status();
    if (s->empty()) return Error(n, key, "is empty", fix);
    // The full check (IPv6 brackets, port range) is the command line's.
    const std::size_t colon = s->rfind(':');
    if (colon != std::string::npos && s->find(':') == colon) {
      auto port = ParseInt(s->substr(colon + 1));
      if (!port || *port < 1 || *port > 65535) {
        return Error(n, key, absl::StrCat("the port in '", *s, "' must be 1..65535"), fix);
      }
      if (colon == 0) return Error(n, key, absl::StrCat("'", *s, "' has no host"), fix);
    }
    Store(key, n, *s);
    return absl::OkStatus();
  }

  absl::Status Job(const YAML::Node& n) {
    if (auto st = CheckMap(n, "job", kJobKeys); !st.ok()) return st;
    if (n["id"]) {
      if (auto st = String(n["id"], "job.id", "write the job id shared by every node, e.g. train-42");
          !st.ok())
        return st;
      const std::string& id = job_.values["job.id"].text;
      if (std::any_of(id.begin(), id.end(), [](char c) { return std::isspace(c) || c == '/'; })) {
        return Error(n["id"], "job.id", absl::StrCat("'", id, "' contains a space or '/'"),
                     "use letters, digits, '-', '_' or '.'");
      }
    }
    if (n["name"]) {
      auto s = Scalar(n["name"], "job.name", "write a display name");
      if (!s.ok()) return s.status();
      job_.name = *s;
    }
    return absl::OkStatus();
  }

  absl::Status Rendezvous(const YAML::Node& n) {
    if (auto st = CheckMap(n, "rendezvous", kRdzvKeys); !st.ok()) return st;
    if (n["backend"]) {
      auto s = Scalar(n["backend"], "rendezvous.backend", "write c10d or static");
      if (!s.ok()) return s.status();
      const std::string b = absl::AsciiStrToLower(*s);
      if (b != "c10d" && b != "ddprun" && b != "static") {
        return Error(n["backend"], "rendezvous.backend",
                     absl::StrCat("must be c10d or static, got '", *s, "'"),
                     "write c10d (ddprund or first_node) or static");
      }
      Store("rendezvous.backend", n["backend"], b);
    }
    if (n["endpoint"]) {
      if (auto st = Endpoint(n["endpoint"], "rendezvous.endpoint"); !st.ok()) return st;
    }
    if (n["token"]) {
      if (auto st = String(n["token"], "rendezvous.token", "write a secret shared by the nodes");
          !st.ok())
        return st;
      if (job_.values["rendezvous.token"].text.find(',') != std::string::npos) {
        return Error(n["token"], "rendezvous.token", "contains a ','", "pick a token without ','");
      }
    }
    if (n["join_timeout"]) {
      if (auto st = Seconds(n["join_timeout"], "rendezvous.join_timeout", false); !st.ok())
        return st;
    }
    if (n["last_call_timeout"]) {
      if (auto st = Seconds(n["last_call_timeout"], "rendezvous.last_call_timeout", true); !st.ok())
        return st;
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
      if (auto st = CheckMap(n, key, kHostKeys); !st.ok()) return st;
      if (!n["host"]) return Error(n, key + ".host", "is missing", fix);
      auto h = Scalar(n["host"], key + ".host", fix);
      if (!h.ok()) return h.status();
      e.host = *h;
      if (n["slots"]) {
        auto s = Scalar(n["slots"], key + ".slots", "write the number of workers on this host");
        if (!s.ok()) return s.status();
        slots_text = *s;
        slots_mark = n["slots"].Mark();
        if (slots_text.empty()) slots_text = "?";
      }
    } else {
      auto s = Scalar(n, key, fix);
      if (!s.ok()) return s.status();
      // DeepSpeed/Horovod hostfile style: "host slots=N".
      std::vector<std::string> words = absl::StrSplit(*s, ' ', absl::SkipWhitespace());
      if (words.empty()) return Error(n, key, "is empty", fix);
      e.host = words[0];
      for (std::size_t w = 1; w < words.size(); ++w) {
        if (!absl::StartsWith(words[w], "slots=") || !slots_text.empty()) {
          return Error(n, key, absl::StrCat("'", *s, "' is not 'HOST slots=N'"), fix);
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
      auto v = ParseInt(slots_text);
      if (!v || *v <= 0 || *v > 100000) {
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
      if (auto st = Host(n[i], i); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status Nodes(const YAML::Node& n) {
    if (n.IsSequence()) return Hosts(n);
    if (n.IsScalar()) return Count(n, "nodes.count");
    if (auto st = CheckMap(n, "nodes", kNodesKeys); !st.ok()) return st;
    if (n["count"]) {
      if (auto st = Count(n["count"], "nodes.count"); !st.ok()) return st;
    }
    if (n["hosts"]) {
      if (auto st = Hosts(n["hosts"]); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status Nproc(const YAML::Node& n) {
    const std::string fix = "write the workers per node: a number, cpu, gpu or auto";
    auto s = Scalar(n, "nproc_per_node", fix);
    if (!s.ok()) return s.status();
    const std::string l = absl::AsciiStrToLower(*s);
    if (l == "cpu" || l == "gpu" || l == "auto") {
      Store("nproc_per_node", n, l);
      return absl::OkStatus();
    }
    auto v = ParseInt(*s);
    if (!v) {
      return Error(n, "nproc_per_node", absl::StrCat("must be a number, cpu, gpu or auto, got '", *s, "'"),
                   fix);
    }
    if (*v <= 0 || *v > 4096) {
      return Error(n, "nproc_per_node", absl::StrCat("must be 1..4096, got ", *v), fix);
    }
    Store("nproc_per_node", n, std::to_string(*v));
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
          auto s = Scalar(n[i], absl::StrCat("command[", i, "]"), fix);
          if (!s.ok()) return s.status();
          job_.command.push_back(*s);
        }
      } else {
        auto s = Scalar(n, "command", fix);
        if (!s.ok()) return s.status();
        job_.command.push_back(*s);
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
        auto s = Scalar(a[i], absl::StrCat("args[", i, "]"), "write each argument as a value");
        if (!s.ok()) return s.status();
        job_.command.push_back(*s);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Restart(const YAML::Node& n) {
    if (auto st = CheckMap(n, "restart", kRestartKeys); !st.ok()) return st;
    if (n["max_restarts"]) {
      if (auto st = Int(n["max_restarts"], "restart.max_restarts", 0, 1000000,
                        "an integer >= 0 (restarts of the whole job)");
          !st.ok())
        return st;
    }
    if (n["grace_period"]) {
      if (auto st = Seconds(n["grace_period"], "restart.grace_period", true); !st.ok()) return st;
    }
    if (n["signals_to_handle"]) {
      if (auto st = String(n["signals_to_handle"], "restart.signals_to_handle",
                           "write signal names, e.g. SIGTERM,SIGUSR1");
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  }

  absl::Status Logs(const YAML::Node& n) {
    if (auto st = CheckMap(n, "logs", kLogsKeys); !st.ok()) return st;
    if (n["log_dir"]) {
      if (auto st = String(n["log_dir"], "logs.log_dir", "write a directory path"); !st.ok())
        return st;
    }
    if (n["redirects"]) {
      if (auto st = Streams(n["redirects"], "logs.redirects"); !st.ok()) return st;
    }
    if (n["tee"]) {
      if (auto st = Streams(n["tee"], "logs.tee"); !st.ok()) return st;
    }
    if (n["local_ranks_filter"]) {
      if (auto st = RankList(n["local_ranks_filter"], "logs.local_ranks_filter"); !st.ok())
        return st;
    }
    if (n["prefix_output"]) {
      if (auto st = Bool(n["prefix_output"], "logs.prefix_output"); !st.ok()) return st;
    }
    if (n["stderr_tail_lines"]) {
      if (auto st = Int(n["stderr_tail_lines"], "logs.stderr_tail_lines", 0, 10000,
                        "an integer 0-10000 (0: workers write stderr to the console directly)");
          !st.ok())
        return st;
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
    if (auto st = CheckMap(n, "environment", kEnvKeys); !st.ok()) return st;
    if (const YAML::Node set = n["set"]) {
      if (!set.IsMap()) {
        return Error(set, "environment.set", absl::StrCat("must be a mapping, got ", KindName(set)),
                     "write NAME: value lines indented below it");
      }
      for (const auto& kv : set) {
        auto name = Scalar(kv.first, "environment.set", "write NAME: value");
        if (!name.ok()) return name.status();
        const std::string key = "environment.set." + *name;
        if (auto st = EnvName(kv.first, key, *name); !st.ok()) return st;
        std::string value;
        if (!kv.second.IsNull()) {
          auto v = Scalar(kv.second, key, "write a single value (quote it if needed)");
          if (!v.ok()) return v.status();
          value = *v;
        }
        job_.env_set.emplace_back(*name, FileValue{value, Where(kv.second.Mark()), key});
      }
    }
    if (const YAML::Node pass = n["pass"]) {
      if (!pass.IsSequence()) {
        return Error(pass, "environment.pass", absl::StrCat("must be a list of names, got ", KindName(pass)),
                     "write pass: [HF_HOME, WANDB_API_KEY]");
      }
      for (std::size_t i = 0; i < pass.size(); ++i) {
        const std::string key = absl::StrCat("environment.pass[", i, "]");
        auto name = Scalar(pass[i], key, "write a variable name");
        if (!name.ok()) return name.status();
        if (auto st = EnvName(pass[i], key, *name); !st.ok()) return st;
        job_.env_pass.push_back(FileValue{*name, Where(pass[i].Mark()), key});
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
      auto key_text = Scalar(kv.first, "nccl", "write setting: value");
      if (!key_text.ok()) return key_text.status();
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
      auto value = Scalar(kv.second, key, "write a single value");
      if (!value.ok()) return value.status();
      std::string text = *value;
      if (var == "NCCL_P2P_DISABLE" || var == "NCCL_SHM_DISABLE") {
        auto b = ToBool(text);
        if (!b) {
          return Error(kv.second, key, absl::StrCat("must be true or false, got '", text, "'"),
                       "write true (disable) or false");
        }
        text = *b ? "1" : "0";
      } else if (var == "NCCL_BUFFSIZE") {
        auto v = ParseInt(text);
        if (!v || *v <= 0) {
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

  absl::Status Scheduler(const YAML::Node& n) {
    auto s = Scalar(n, "scheduler", "write auto, slurm, mpi or none");
    if (!s.ok()) return s.status();
    const std::string l = absl::AsciiStrToLower(*s);
    if (l == "auto") job_.scheduler = SchedulerMode::kAuto;
    else if (l == "slurm") job_.scheduler = SchedulerMode::kSlurm;
    else if (l == "mpi") job_.scheduler = SchedulerMode::kMpi;
    else if (l == "none") job_.scheduler = SchedulerMode::kNone;
    else {
      return Error(n, "scheduler", absl::StrCat("must be auto, slurm, mpi or none, got '", *s, "'"),
                   "write auto (detect Slurm and OpenMPI/PMIx), slurm, mpi or none");
    }
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
        auto v = ParseInt(np->second.text);
        if (v && *v != first->slots) {
          return absl::InvalidArgumentError(absl::StrCat(
              np->second.location, ": nproc_per_node: is ", *v, " but the hosts have slots=",
              first->slots, " (", first->location, "); make them agree or drop one of them"));
        }
      }
      auto count = job_.values.find("nodes.count");
      if (count != job_.values.end()) {
        const std::vector<std::string> parts = absl::StrSplit(count->second.text, ':');
        const long long lo = *ParseInt(parts[0]);
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
    if (auto st = CheckMap(root, "", kTopKeys); !st.ok()) return st;
    try {
      absl::Status st;
      if (root["job"]) st.Update(Job(root["job"]));
      if (st.ok() && root["rendezvous"]) st.Update(Rendezvous(root["rendezvous"]));
      if (st.ok() && root["nodes"]) st.Update(Nodes(root["nodes"]));
      if (st.ok() && root["scheduler"]) st.Update(Scheduler(root["scheduler"]));
      if (st.ok() && root["nproc_per_node"]) st.Update(Nproc(root["nproc_per_node"]));
      if (st.ok() && root["role"]) st.Update(String(root["role"], "role", "write a role name"));
      if (st.ok()) st.Update(Command(root));
      if (st.ok() && root["module"]) st.Update(Bool(root["module"], "module"));
      if (st.ok() && root["no_python"]) st.Update(Bool(root["no_python"], "no_python"));
      if (st.ok() && root["restart"]) st.Update(Restart(root["restart"]));
      if (st.ok() && root["logs"]) st.Update(Logs(root["logs"]));
      if (st.ok() && root["environment"]) st.Update(Environment(root["environment"]));
      if (st.ok() && root["nccl"]) st.Update(Nccl(root["nccl"]));
      if (st.ok()) st.Update(CrossChecks(root));
      if (!st.ok()) return st;
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

std::size_t KeyDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::map<std::string, KnobValue> JobConfig::FlagValues() const {
  std::map<std::string, KnobValue> out;
  auto file = [](const FileValue& v) { return KnobValue{v.text, v.Source(), Origin::kFile}; };
  for (const Knob& k : kKnobs) {
    if (k.yaml_key == nullptr) continue;
    auto it = values.find(k.yaml_key);
    if (it == values.end()) continue;
    const std::string dest = k.rdzv_conf ? absl::StrCat("rdzv_conf.", k.rdzv_conf) : k.flag;
    out[dest] = file(it->second);
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
