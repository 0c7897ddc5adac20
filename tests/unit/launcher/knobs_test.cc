// The knob table (knobs.h) is the one owner of every launcher knob: the docs
// show each knob with the table's default, the command line and the job file
// give the same message for the same bad value, and the agent's copy of the
// stderr tail default agrees with the table.
#include "ddprun/launcher/knobs.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ddprun/agent/log_spec.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/value_parsers.h"

namespace ddprun::launcher {
namespace {

std::string ReadDoc(const std::string& name) {
  std::ifstream in(std::string(DDPRUN_SOURCE_DIR) + "/docs/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  REQUIRE_FALSE(ss.str().empty());
  return ss.str();
}

// The cells of every markdown table row ("| a | b |" -> {"a", "b"}), with
// backticks removed; "\|" inside a cell is kept as '|'.
std::vector<std::vector<std::string>> TableRows(const std::string& doc) {
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    if (!absl::ConsumePrefix(&line, "| ")) continue;
    const std::string text = absl::StrReplaceAll(line, {{"\\|", "\x01"}, {"`", ""}});
    std::vector<std::string> cells;
    for (absl::string_view cell : absl::StrSplit(text, '|')) {
      cells.push_back(absl::StrReplaceAll(absl::StripAsciiWhitespace(cell), {{"\x01", "|"}}));
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

// Whether the first cell names `flag` (--flag_name or --flag-name, alone or
// followed by its metavar).
bool NamesFlag(const std::string& cell, const std::string& spelling) {
  for (absl::string_view part : absl::StrSplit(cell, ", ")) {
    if (part == spelling || absl::StartsWith(part, spelling + " ")) return true;
  }
  return false;
}

TEST_CASE("docs/cli.md shows every flag of the knob table with its default", "[unit]") {
  const auto rows = TableRows(ReadDoc("cli.md"));
  for (const Knob& k : kKnobs) {
    if (!k.is_flag()) continue;
    INFO("--" << k.name << ", default " << k.default_text);
    const std::vector<std::string>* row = nullptr;
    for (const auto& r : rows) {
      if (r.size() >= 3 && (NamesFlag(r[0], std::string("--") + k.name) ||
                            NamesFlag(r[0], "--" + DashName(k.name)))) {
        row = &r;
        break;
      }
    }
    REQUIRE(row != nullptr);
    CHECK(absl::StartsWith((*row)[1], k.default_text));
    if (k.group != nullptr) CHECK_THAT((*row)[2], Catch::Contains(PetName(k.name)));
  }
  // The keys of --rdzv_conf: named in its row with their defaults.
  for (const auto& r : rows) {
    if (!NamesFlag(r[0], "--rdzv_conf")) continue;
    for (const Knob& k : kKnobs) {
      if (k.rdzv_conf == nullptr) continue;
      INFO(k.rdzv_conf);
      CHECK_THAT(r[3], Catch::Contains(std::string(k.rdzv_conf) + "="));
      if (k.default_value != nullptr) {
        CHECK_THAT(r[3], Catch::Contains(std::string("default ") + k.default_text));
      }
    }
  }
}

TEST_CASE("docs/config.md shows every YAML key of the knob table with its default", "[unit]") {
  const auto rows = TableRows(ReadDoc("config.md"));
  for (const Knob& k : kKnobs) {
    if (k.yaml_key == nullptr) continue;
    INFO(k.yaml_key << ", default " << k.default_text);
    const std::vector<std::string>* row = nullptr;
    for (const auto& r : rows) {
      if (r.size() >= 5 && r[0] == k.yaml_key) row = &r;
    }
    REQUIRE(row != nullptr);
    CHECK(absl::StartsWith((*row)[3], k.default_text));
    if (k.is_flag()) {
      CHECK_THAT((*row)[1],
                 Catch::Contains(std::string("--") + k.name) ||
                     Catch::Contains(std::string("-") + (k.short_flag ? k.short_flag : "?")));
      CHECK_THAT((*row)[2], Catch::Contains(PetName(k.name)));
    }
  }
}

TEST_CASE("the knob table: names, YAML keys and defaults are consistent", "[unit]") {
  std::set<std::string> names, yaml_keys;
  for (const Knob& k : kKnobs) {
    if (k.is_flag()) {
      INFO(k.name);
      CHECK(names.insert(k.name).second);
      CHECK(k.group != nullptr);
      // A knob with a default parses it.
      if (k.default_value != nullptr && k.type != ValueType::kRdzvConf &&
          std::string(k.default_value).size() > 0) {
        CHECK(NormalizeKnobValue(k, k.default_value).ok());
      }
    }
    if (k.yaml_key != nullptr) CHECK(yaml_keys.insert(k.yaml_key).second);
  }
  // The agent keeps a copy of this default for callers that build LogSpec
  // themselves; it must agree with the table, which owns it.
  CHECK(std::string(KnobNamed("stderr_tail_lines").default_value) ==
        std::to_string(agent::kDefaultStderrTailLines));
  // The ports are rendezvous/host_port.h's.
  CHECK(std::string(KnobNamed("master_port").default_value) ==
        std::to_string(rendezvous::kDefaultMasterPort));
}

// The same bad value on the command line and in a job file: the same
// problem-and-fix text after the part that says where it came from.
TEST_CASE("a bad value reads the same from a flag, a PET_ variable and a job file", "[unit]") {
  struct Case {
    const char* flag;
    const char* yaml;  // "section:\n  key: " or "key: "
    const char* value;
  };
  const Case cases[] = {
      {"nnodes", "nodes:\n  count: ", "4:2"},
      {"nproc_per_node", "nproc_per_node: ", "many"},
      {"max_restarts", "restart:\n  max_restarts: ", "-1"},
      {"grace_period", "restart:\n  grace_period: ", "soon"},
      {"stderr_tail_lines", "logs:\n  stderr_tail_lines: ", "20000"},
      {"redirects", "logs:\n  redirects: ", "5"},
      {"local_ranks_filter", "logs:\n  local_ranks_filter: ", "a"},
      {"rdzv_endpoint", "rendezvous:\n  endpoint: ", "host:99999"},
      {"rdzv_backend", "rendezvous:\n  backend: ", "zk"},
      {"rdzv_id", "job:\n  id: ", "has space"},
      {"role", "role: ", "\"\""},
      {"signals_to_handle", "restart:\n  signals_to_handle: ", "SIGNOPE"},
      {"forward_signals", "restart:\n  forward_signals: ", "SIGNOPE"},
  };
  const Env env = {{"PATH", "/usr/bin:/bin"}};
  HostFacts host;
  host.cpu_count = 4;
  for (const Case& c : cases) {
    INFO(c.flag << " = " << c.value);
    std::string value = c.value;
    if (value == "\"\"") value = "";
    // Flag.
    std::string flag_msg;
    if (!value.empty()) {
      auto p = ParseCommandLine({"ddprun", std::string("--") + c.flag + "=" + value, "/bin/true"},
                                env, host);
      REQUIRE_FALSE(p.ok());
      flag_msg = std::string(p.status().message());
    }
    // PET_ variable (an empty one counts as unset: only the file can say "").
    std::string env_msg;
    if (!value.empty()) {
      Env e = env;
      e[PetName(c.flag)] = value;
      auto p = ParseCommandLine({"ddprun", "/bin/true"}, e, host);
      REQUIRE_FALSE(p.ok());
      env_msg = std::string(p.status().message());
    }
    // Job file.
    auto job = ParseJobConfig(std::string(c.yaml) + c.value + "\n", "job.yaml");
    REQUIRE_FALSE(job.ok());
    const std::string file_msg(job.status().message());
    const std::string yaml_key = KnobNamed(c.flag).yaml_key;
    const std::string file_prefix_end = yaml_key + ": ";
    REQUIRE(file_msg.find(file_prefix_end) != std::string::npos);
    const std::string file_text =
        file_msg.substr(file_msg.find(file_prefix_end) + file_prefix_end.size());
    CHECK(file_msg.find('\n') == std::string::npos);
    if (!flag_msg.empty()) {
      const std::string prefix = std::string("ddprun: --") + c.flag + " ";
      REQUIRE(flag_msg.rfind(prefix, 0) == 0);
      CHECK(flag_msg.substr(prefix.size()) == file_text);
      const std::string env_prefix = "ddprun: " + PetName(c.flag) + " (--" + c.flag + ") ";
      REQUIRE(env_msg.rfind(env_prefix, 0) == 0);
      CHECK(env_msg.substr(env_prefix.size()) == file_text);
    }
  }
}

TEST_CASE("one job-id rule for --rdzv_id, PET_RDZV_ID and job.id", "[unit]") {
  const Env env = {{"PATH", "/usr/bin:/bin"}};
  HostFacts host;
  host.cpu_count = 4;
  auto flag = ParseCommandLine({"ddprun", "--rdzv_id=a b", "/bin/true"}, env, host);
  REQUIRE_FALSE(flag.ok());
  CHECK(std::string(flag.status().message()) ==
        "ddprun: --rdzv_id is not a valid job id: the job id 'a b' contains a space; use 1-256 "
        "letters, digits and '-', '_', '.', ':', '@', '+', not starting with '-' or '.'");
  Env pet = env;
  pet["PET_RDZV_ID"] = "-x";
  auto from_env = ParseCommandLine({"ddprun", "--rdzv_endpoint=h", "/bin/true"}, pet, host);
  REQUIRE_FALSE(from_env.ok());
  CHECK_THAT(std::string(from_env.status().message()),
             Catch::StartsWith("ddprun: PET_RDZV_ID (--rdzv_id) is not a valid job id") &&
                 Catch::Contains("starts with '-'"));
  auto file = ParseJobConfig("job:\n  id: a/b\n", "job.yaml");
  REQUIRE_FALSE(file.ok());
  CHECK(std::string(file.status().message()) ==
        "job.yaml:2:7: job.id: is not a valid job id: the job id 'a/b' contains '/'; use 1-256 "
        "letters, digits and '-', '_', '.', ':', '@', '+', not starting with '-' or '.'");
  // Every id the rule allows is accepted, as written.
  CHECK(ParseCommandLine({"ddprun", "--rdzv_id=team:job@2+x_1.0", "/bin/true"}, env, host)
            ->options.job_id == "team:job@2+x_1.0");
}

}  // namespace
}  // namespace ddprun::launcher
