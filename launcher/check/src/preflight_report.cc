// `ddprun check`'s report (preflight.h): the checks run over every node's
// facts, the table, its JSON, the exit code, and the facts' wire format.
#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ddprun/launcher/check/preflight.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher::preflight {
namespace {

using Json = nlohmann::ordered_json;

struct Counts {
  int pass = 0, na = 0, warn = 0, fail = 0;
};

Counts Count(const Report& r) {
  Counts c;
  for (const CheckResult& x : r.results) {
    switch (x.verdict) {
      case Verdict::kPass:
        ++c.pass;
        break;
      case Verdict::kNotApplicable:
        ++c.na;
        break;
      case Verdict::kWarn:
        ++c.warn;
        break;
      case Verdict::kFail:
        ++c.fail;
        break;
    }
  }
  return c;
}

}  // namespace

Report RunChecks(const std::vector<NodeFacts>& nodes, const JobFacts& job,
                 const std::vector<std::unique_ptr<Check>>& checks) {
  Report report;
  report.job = job;
  report.nodes = nodes;
  for (const NodeFacts& n : nodes) {
    for (const auto& check : checks) report.results.push_back(check->Run(n, nodes, job));
  }
  return report;
}

int ExitCode(const Report& report) {
  const Counts c = Count(report);
  if (c.fail > 0) return kExitCheckFailed;
  if (c.warn > 0) return kExitCheckWarnings;
  return kExitSuccess;
}

std::string Summary(const Report& report) {
  const Counts c = Count(report);
  return absl::StrCat(report.nodes.size(), " node", report.nodes.size() == 1 ? "" : "s", ": ",
                      c.pass, " pass, ", c.na, " n/a, ", c.warn, " warn, ", c.fail, " fail");
}

std::string FormatText(const Report& report) {
  std::string out = absl::StrFormat(
      "ddprun check: job %s, %d node%s x %d worker%s (world size %d)\n", report.job.job_id,
      report.job.nnodes, report.job.nnodes == 1 ? "" : "s", report.job.nproc_per_node,
      report.job.nproc_per_node == 1 ? "" : "s", report.job.WorldSize());
  // "name (advertised address)" when they differ, e.g. two nodes on one host.
  auto host_of = [](const NodeFacts& n) {
    if (n.hostname.empty()) return n.host;
    if (n.host.empty() || n.host == n.hostname) return n.hostname;
    return absl::StrCat(n.hostname, " (", n.host, ")");
  };
  size_t host_width = 4;
  for (const NodeFacts& n : report.nodes) host_width = std::max(host_width, host_of(n).size());
  const std::string header =
      absl::StrFormat("%-4s %-*s %-18s %-6s %s\n", "NODE", static_cast<int>(host_width), "HOST",
                      "CHECK", "RESULT", "DETAIL");
  out += header;
  int last_node = -1;
  for (const CheckResult& r : report.results) {
    std::string node, host;
    if (r.node != last_node) {
      node = std::to_string(r.node);
      const auto it = std::find_if(report.nodes.begin(), report.nodes.end(),
                                   [&](const NodeFacts& n) { return n.group_rank == r.node; });
      host = it == report.nodes.end() ? "?" : host_of(*it);
      last_node = r.node;
    }
    absl::StrAppendFormat(&out, "%-4s %-*s %-18s %-6s %s\n", node, static_cast<int>(host_width),
                          host, r.check, VerdictName(r.verdict), r.detail);
    if (!r.fix.empty() && (r.verdict == Verdict::kWarn || r.verdict == Verdict::kFail)) {
      absl::StrAppendFormat(&out, "%-4s %-*s %-18s %-6s fix: %s\n", "",
                            static_cast<int>(host_width), "", "", "", r.fix);
    }
  }
  absl::StrAppend(&out, "summary: ", Summary(report), "; exit ", ExitCode(report), "\n");
  return out;
}

std::string FormatJson(const Report& report) {
  const Counts c = Count(report);
  Json nodes = Json::array();
  for (const NodeFacts& n : report.nodes) {
    Json checks = Json::array();
    for (const CheckResult& r : report.results) {
      if (r.node != n.group_rank) continue;
      Json line = {{"check", r.check}, {"result", VerdictName(r.verdict)}, {"detail", r.detail}};
      if (!r.fix.empty()) line["fix"] = r.fix;
      checks.push_back(std::move(line));
    }
    nodes.push_back({{"node", n.group_rank},
                     {"host", n.host},
                     {"hostname", n.hostname},
                     {"checks", std::move(checks)}});
  }
  Json out = {{"job", report.job.job_id},
              {"nnodes", report.job.nnodes},
              {"nproc_per_node", report.job.nproc_per_node},
              {"nodes", std::move(nodes)},
              {"summary", {{"pass", c.pass}, {"n/a", c.na}, {"warn", c.warn}, {"fail", c.fail}}},
              {"exit_code", ExitCode(report)}};
  return out.dump(2) + "\n";
}

std::string FactsToJson(const NodeFacts& f) {
  Json interfaces = Json::array();
  for (const Interface& i : f.interfaces) {
    interfaces.push_back({{"name", i.name}, {"up", i.up}, {"has_address", i.has_address}});
  }
  Json resolved = Json::array();
  for (const Resolved& r : f.resolved) {
    resolved.push_back({{"name", r.name}, {"ok", r.ok}, {"error", r.error}});
  }
  Json reach = Json::array();
  for (const Reach& r : f.reach) {
    reach.push_back(
        {{"what", r.what}, {"address", r.address}, {"ok", r.ok}, {"error", r.error}, {"ms", r.ms}});
  }
  Json j = {{"reported", f.reported},
            {"group_rank", f.group_rank},
            {"host", f.host},
            {"hostname", f.hostname},
            {"error", f.error},
            {"env", f.env},
            {"interfaces", std::move(interfaces)},
            {"gpu_count", f.gpu_count},
            {"gpu_source", f.gpu_source},
            {"cpu_count", f.cpu_count},
            {"shm_total", f.shm_total},
            {"shm_free", f.shm_free},
            {"nofile_soft", f.nofile_soft},
            {"memlock_soft", f.memlock_soft},
            {"ddprun_version", f.ddprun_version},
            {"script_path", f.script_path},
            {"script_sha256", f.script_sha256},
            {"script_error", f.script_error},
            {"python_command", f.python_command},
            {"python_exec", f.python_exec},
            {"script_imports_torch", f.script_imports_torch},
            {"python_version", f.python_version},
            {"torch_version", f.torch_version},
            {"python_error", f.python_error},
            {"resolved", std::move(resolved)},
            {"reach", std::move(reach)},
            {"clock_measured", f.clock_measured},
            {"clock_offset_ms", f.clock_offset_ms},
            {"clock_uncertainty_ms", f.clock_uncertainty_ms}};
  if (f.ib_devices) j["ib_devices"] = *f.ib_devices;
  return j.dump();
}

absl::StatusOr<NodeFacts> FactsFromJson(std::string_view text) {
  const Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "a node's check facts are not JSON; run the same ddprun on "
        "every node");
  }
  try {
    NodeFacts f;
    f.reported = j.at("reported").get<bool>();
    f.group_rank = j.at("group_rank").get<int>();
    f.host = j.at("host").get<std::string>();
    f.hostname = j.at("hostname").get<std::string>();
    f.error = j.at("error").get<std::string>();
    f.env = j.at("env").get<std::map<std::string, std::string>>();
    for (const Json& i : j.at("interfaces")) {
      f.interfaces.push_back({i.at("name").get<std::string>(), i.at("up").get<bool>(),
                              i.at("has_address").get<bool>()});
    }
    if (j.contains("ib_devices")) f.ib_devices = j.at("ib_devices").get<std::vector<std::string>>();
    f.gpu_count = j.at("gpu_count").get<int>();
    f.gpu_source = j.at("gpu_source").get<std::string>();
    f.cpu_count = j.at("cpu_count").get<int>();
    f.shm_total = j.at("shm_total").get<std::int64_t>();
    f.shm_free = j.at("shm_free").get<std::int64_t>();
    f.nofile_soft = j.at("nofile_soft").get<std::int64_t>();
    f.memlock_soft = j.at("memlock_soft").get<std::int64_t>();
    f.ddprun_version = j.at("ddprun_version").get<std::string>();
    f.script_path = j.at("script_path").get<std::string>();
    f.script_sha256 = j.at("script_sha256").get<std::string>();
    f.script_error = j.at("script_error").get<std::string>();
    f.python_command = j.at("python_command").get<bool>();
    f.python_exec = j.value("python_exec", std::string());  // absent from older nodes
    f.script_imports_torch = j.value("script_imports_torch", false);
    f.python_version = j.at("python_version").get<std::string>();
    f.torch_version = j.at("torch_version").get<std::string>();
    f.python_error = j.at("python_error").get<std::string>();
    for (const Json& r : j.at("resolved")) {
      f.resolved.push_back({r.at("name").get<std::string>(), r.at("ok").get<bool>(),
                            r.at("error").get<std::string>()});
    }
    for (const Json& r : j.at("reach")) {
      f.reach.push_back({r.at("what").get<std::string>(), r.at("address").get<std::string>(),
                         r.at("ok").get<bool>(), r.at("error").get<std::string>(),
                         r.at("ms").get<double>()});
    }
    f.clock_measured = j.at("clock_measured").get<bool>();
    f.clock_offset_ms = j.at("clock_offset_ms").get<double>();
    f.clock_uncertainty_ms = j.at("clock_uncertainty_ms").get<double>();
    return f;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a node's check facts lack a field (", e.what(),
                                                   "); run the same ddprun on every node"));
  }
}

}  // namespace ddprun::launcher::preflight
