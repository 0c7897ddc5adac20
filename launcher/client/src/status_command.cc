// `ddprun status`: one Status RPC, rendered as a table or JSON.
#include "ddprun/launcher/client/status_command.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon_client.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"
#include "nlohmann/json.hpp"

namespace ddprun::launcher {
namespace {

// "0-3" for a node's global ranks, "-" before it has any.
std::string Ranks(const rendezvous::NodeInfo& n) {
  if (n.base_rank < 0 || n.nproc <= 0) return "-";
  if (n.nproc == 1) return std::to_string(n.base_rank);
  return absl::StrCat(n.base_rank, "-", n.base_rank + n.nproc - 1);
}

}  // namespace

std::string FormatStatusText(const std::vector<rendezvous::JobStatus>& jobs) {
  if (jobs.empty()) return "no jobs\n";
  std::string out = absl::StrFormat("%-24s %-6s %-10s %-6s %-6s %-8s %s\n", "JOB", "ROUND", "STATE",
                                    "NODES", "WORLD", "RESTARTS", "WAITING");
  for (const auto& j : jobs) {
    absl::StrAppendFormat(&out, "%-24s %-6d %-10s %-6d %-6d %-8d %d\n", j.job_id, j.round, j.state,
                          j.nodes.size(), j.world_size, j.restart_count, j.waiting);
    // A round still forming has a deadline: the first joined node's join
    // timeout (a fixed-size job waiting for a lost node's replacement).
    if (j.state == "gathering" && j.max_nodes > 0 && j.join_deadline_in_s > 0) {
      absl::StrAppend(&out, "  waiting for ", j.max_nodes, " nodes (", j.nodes.size(), " of ",
                      j.max_nodes, " have joined); the round fails at ",
                      rendezvous::WallClockAfter(rendezvous::Seconds(j.join_deadline_in_s)),
                      " (in ", static_cast<long>(j.join_deadline_in_s), " s) unless they join\n");
    }
    // Hosts the daemon refuses for now, and why ("HOST: N worker failures, S s left").
    for (const auto& q : j.quarantined) absl::StrAppend(&out, "  quarantined ", q, "\n");
    for (const auto& n : j.nodes) {
      absl::StrAppendFormat(&out, "  node %-3s %-28s pid %-8d nproc %-4d ranks %s\n",
                            n.group_rank >= 0 ? std::to_string(n.group_rank) : std::string("-"),
                            n.host, n.pid, n.nproc, Ranks(n));
    }
  }
  return out;
}

std::string FormatStatusJson(const std::string& endpoint,
                             const std::vector<rendezvous::JobStatus>& jobs) {
  // ordered_json keeps the keys in the documented order (docs/cli.md).
  using Json = nlohmann::ordered_json;
  Json js = Json::array();
  for (const auto& j : jobs) {
    Json nodes = Json::array();
    for (const auto& n : j.nodes) {
      nodes.push_back({{"group_rank", n.group_rank},
                       {"host", n.host},
                       {"pid", n.pid},
                       {"nproc", n.nproc},
                       {"base_rank", n.base_rank},
                       {"ranks", Ranks(n)}});
    }
    js.push_back({{"job_id", j.job_id},
                  {"round", j.round},
                  {"state", j.state},
                  {"world_size", j.world_size},
                  {"restarts", j.restart_count},
                  {"waiting", j.waiting},
                  {"quarantined", j.quarantined},
                  {"nodes", std::move(nodes)},
                  {"min_nodes", j.min_nodes},
                  {"max_nodes", j.max_nodes},
                  {"join_deadline_in_s", j.join_deadline_in_s}});
  }
  const Json doc = {{"endpoint", endpoint}, {"jobs", std::move(js)}};
  // Bytes that are not UTF-8 (a host name from a stranger) become U+FFFD
  // instead of an exception.
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

int RunStatusCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "ddprun status: list the jobs a ddprund serves (round, state, nodes, ranks, world size, "
      "restarts).",
      "ddprun status"};
  app.set_help_flag("-h,--help", "Print this help and exit");
  DaemonClientFlags flags;
  std::string job_id;
  bool json = false;
  AddDaemonClientFlags(app, flags, "ddprund to ask");
  app.add_option("--rdzv_id,--rdzv-id", job_id, "Only this job");
  app.add_flag("--json", json, "Print JSON instead of a table");
  if (auto done = ParseClientCommand(app, args, "status", out, err)) return *done;
  if (!job_id.empty()) {
    if (auto id = ParseJobIdValue(job_id); !id.ok()) {
      err << "ddprun status: --rdzv_id " << id.status().message() << std::endl;
      return kExitUsage;
    }
  }
  auto daemon = ConnectToDaemon(flags);
  if (!daemon.ok()) {
    err << "ddprun status: " << daemon.status().message() << std::endl;
    return ExitCodeOf(daemon.status());
  }
  const rendezvous::HostPort* hp = &daemon->endpoint;
  const auto timeout = daemon->timeout;
  auto& client = daemon->client;
  auto jobs = client->Status(job_id, timeout);
  if (!jobs.ok()) {
    err << "ddprun status: " << jobs.status().message() << std::endl;
    return kExitRendezvousError;
  }
  if (!job_id.empty() && jobs->empty()) {  // as `ddprun top --job` says it
    err << "ddprun status: no such job '" << job_id << "' at " << rendezvous::FormatHostPort(*hp)
        << "; run ddprun status without --rdzv_id to list its jobs" << std::endl;
    return kExitRendezvousError;
  }
  out << (json ? FormatStatusJson(rendezvous::FormatHostPort(*hp), *jobs)
               : FormatStatusText(*jobs));
  out.flush();
  return kExitSuccess;
}

}  // namespace ddprun::launcher
