// Node placement: Slurm host lists, scheduler variables and matching this
// machine against the file's node list.
#include "ddprun/launcher/placement.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/agent/host.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/launcher/value_parsers.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::launcher {
namespace {

constexpr std::size_t kMaxHosts = 100000;
using rendezvous::kDefaultMasterPort;
using rendezvous::kDefaultRdzvPort;

using Env = std::map<std::string, std::string>;

// A whole non-negative integer (value_parsers.h's count parser).
std::optional<long long> ToInt(const std::string& s) {
  auto v = ParseCount(s, 0, std::numeric_limits<long>::max(), "");
  return v.ok() ? std::optional<long long>(*v) : std::nullopt;
}

const std::string* Get(const Env& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The first of `names` that is set: its name and value.
std::optional<std::pair<std::string, std::string>> First(const Env& env,
                                                        std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const std::string* v = Get(env, n)) return std::make_pair(std::string(n), *v);
  return std::nullopt;
}

absl::Status Bad(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("ddprun: ", message));
}

absl::StatusOr<int> IntVar(const std::pair<std::string, std::string>& var, long long lo) {
  auto v = ToInt(var.second);
  if (!v || *v < lo || *v > 1000000) {
    return Bad(absl::StrCat(var.first, "='", var.second, "' is not an integer >= ", lo,
                            "; the scheduler's environment looks damaged, or unset it"));
  }
  return static_cast<int>(*v);
}

// Expands one item (no top-level commas) into out.
absl::Status ExpandItem(const std::string& item, const std::string& whole,
                        std::vector<std::string>& out) {
  const std::size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) {
      return Bad(absl::StrCat("host list '", whole, "' has a ']' without '['"));
    }
    out.push_back(item);
    return absl::OkStatus();
  }
  const std::size_t close = item.find(']', open);
  if (close == std::string::npos) {
    return Bad(absl::StrCat("host list '", whole, "' has a '[' without ']'"));
  }
  const std::string prefix = item.substr(0, open);
  const std::string body = item.substr(open + 1, close - open - 1);
  const std::string suffix = item.substr(close + 1);
  if (body.empty()) return Bad(absl::StrCat("host list '", whole, "' has an empty '[]'"));
  for (absl::string_view range : absl::StrSplit(body, ',')) {
    const std::vector<std::string> bounds = absl::StrSplit(range, '-');
    auto malformed = [&] {
      return Bad(absl::StrCat("host list '", whole, "' has a bad range '", range,
                              "'; write [LO-HI] or [N,...] with digits"));
    };
    if (bounds.size() > 2 || bounds[0].empty() ||
        !std::all_of(range.begin(), range.end(), [](char c) { return std::isdigit(c) || c == '-'; })) {
      return malformed();
    }
    auto lo = ToInt(bounds[0]);
    auto hi = bounds.size() == 2 ? ToInt(bounds[1]) : lo;
    if (!lo || !hi) return malformed();
    if (*hi < *lo) {
      return Bad(absl::StrCat("host list '", whole, "' has a reversed range '", range, "'"));
    }
    if (*hi - *lo >= static_cast<long long>(kMaxHosts) || out.size() > kMaxHosts) {
      return Bad(absl::StrCat("host list '", whole, "' expands to over ", kMaxHosts, " hosts"));
    }
    const std::size_t width = bounds[0].size();
    for (long long v = *lo; v <= *hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      // Further brackets in the suffix multiply out.
      DDPRUN_RETURN_IF_ERROR(ExpandItem(prefix + num + suffix, whole, out));
      if (out.size() > kMaxHosts) {
        return Bad(absl::StrCat("host list '", whole, "' expands to over ", kMaxHosts, " hosts"));
      }
    }
  }
  return absl::OkStatus();
}

bool IsIpAddress(const std::string& s) {
  in_addr a4{};
  in6_addr a6{};
  return ::inet_pton(AF_INET, s.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, s.c_str(), &a6) == 1;
}

std::string ShortName(const std::string& s) {
  return absl::AsciiStrToLower(s.substr(0, s.find('.')));
}

// Whether a name of this machine denotes `entry`.
bool SameHost(const std::string& entry, const std::string& name) {
  if (absl::AsciiStrToLower(entry) == absl::AsciiStrToLower(name)) return true;
  return !IsIpAddress(entry) && !IsIpAddress(name) && ShortName(entry) == ShortName(name);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(const std::string& list) {
  std::vector<std::string> out;
  std::string item;
  int depth = 0;
  auto flush = [&]() -> absl::Status {
    const std::string trimmed(absl::StripAsciiWhitespace(item));
    item.clear();
    if (trimmed.empty()) return absl::OkStatus();
    return ExpandItem(trimmed, list, out);
  };
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Bad(absl::StrCat("host list '", list, "' has a ']' without '['"));
    if (c == ',' && depth == 0) {
      DDPRUN_RETURN_IF_ERROR(flush());
    } else {
      item += c;
    }
  }
  if (depth != 0) return Bad(absl::StrCat("host list '", list, "' has a '[' without ']'"));
  DDPRUN_RETURN_IF_ERROR(flush());
  if (out.empty()) return Bad(absl::StrCat("host list '", list, "' names no host"));
  return out;
}

absl::StatusOr<std::optional<SchedulerInfo>> DetectScheduler(const Env& env, SchedulerMode mode) {
  if (mode == SchedulerMode::kNone) return std::optional<SchedulerInfo>();
  const auto slurm_list = First(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  const bool in_slurm = Get(env, "SLURM_JOB_ID") && (slurm_list || Get(env, "SLURM_NODEID"));
  const bool in_mpi = Get(env, "OMPI_COMM_WORLD_RANK") || Get(env, "PMIX_RANK") || Get(env, "PMI_RANK");

  if (mode == SchedulerMode::kSlurm || (mode == SchedulerMode::kAuto && in_slurm)) {
    if (!in_slurm) {
      return Bad("scheduler: slurm, but SLURM_JOB_ID and SLURM_NODEID are not set; run ddprun "
                 "under srun, or set scheduler: auto");
    }
    SchedulerInfo s;
    s.name = "slurm";
    if (slurm_list) {
      auto hosts = ExpandSlurmHostlist(slurm_list->second);
      if (!hosts.ok()) {
        return Bad(absl::StrCat(slurm_list->first, ": ", hosts.status().message().substr(8)));
      }
      s.hosts = std::move(*hosts);
      s.hosts_var = slurm_list->first;
    }
    if (auto n = First(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) {
      DDPRUN_ASSIGN_OR_RETURN(s.nnodes, IntVar(*n, 1));
      s.nnodes_var = absl::StrCat(n->first, "=", n->second);
      if (!s.hosts.empty() && s.hosts.size() != static_cast<std::size_t>(s.nnodes)) {
        return Bad(absl::StrCat("Slurm's counts disagree: ", s.nnodes_var, " but ", s.hosts_var,
                                " lists ", s.hosts.size(), " hosts; check the allocation (srun "
                                "--nodes) or unset the stale variable"));
      }
    } else if (!s.hosts.empty()) {
      s.nnodes = static_cast<int>(s.hosts.size());
      s.nnodes_var = s.hosts_var;
    }
    if (auto r = First(env, {"SLURM_NODEID"})) {
      DDPRUN_ASSIGN_OR_RETURN(s.node_rank, IntVar(*r, 0));
      s.rank_var = absl::StrCat(r->first, "=", r->second);
      if (s.nnodes > 0 && s.node_rank >= s.nnodes) {
        return Bad(absl::StrCat("Slurm's counts disagree: ", s.rank_var, " is not below ",
                                s.nnodes_var, "; check the allocation"));
      }
    }
    // Inside an srun step there must be one ddprun per node: it starts the
    // workers itself. (In the batch script only the first node runs.)
    if (Get(env, "SLURM_STEP_ID")) {
      if (auto t = First(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}); t && s.nnodes > 0) {
        DDPRUN_ASSIGN_OR_RETURN(const int tasks, IntVar(*t, 1));
        if (tasks != s.nnodes) {
          return Bad(absl::StrCat("srun started ", tasks, " tasks (", t->first, ") on ", s.nnodes,
                                  " nodes (", s.nnodes_var, "); ddprun starts the workers itself, "
                                  "so run one per node: srun --ntasks-per-node=1 ddprun ..."));
        }
      }
    } else if (s.nnodes > 1) {
      s.warnings.push_back(absl::StrCat(
          "ddprun: in a Slurm job but not in an srun step: only this node runs ddprun; start it on "
          "every node with srun --ntasks-per-node=1 ddprun ..."));
    }
    return std::optional<SchedulerInfo>(std::move(s));
  }

  if (mode == SchedulerMode::kMpi || (mode == SchedulerMode::kAuto && in_mpi)) {
    if (!in_mpi) {
      return Bad("scheduler: mpi, but none of OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK is set; "
                 "run ddprun under mpirun, or set scheduler: auto");
    }
    SchedulerInfo s;
    s.name = "mpi";
    if (auto local = First(env, {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})) {
      DDPRUN_ASSIGN_OR_RETURN(const int local_size, IntVar(*local, 1));
      if (local_size > 1) {
        return Bad(absl::StrCat("mpirun started ", local_size, " ddprun processes on this node (",
                                local->first, "); ddprun starts the workers itself, so run one "
                                "per node: mpirun --map-by ppr:1:node ddprun ..."));
      }
    }
    auto r = First(env, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
    DDPRUN_ASSIGN_OR_RETURN(s.node_rank, IntVar(*r, 0));
    s.rank_var = absl::StrCat(r->first, "=", r->second);
    if (auto n = First(env, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})) {
      DDPRUN_ASSIGN_OR_RETURN(s.nnodes, IntVar(*n, 1));
      s.nnodes_var = absl::StrCat(n->first, "=", n->second);
      if (s.node_rank >= s.nnodes) {
        return Bad(absl::StrCat("MPI's counts disagree: ", s.rank_var, " is not below ",
                                s.nnodes_var));
      }
    }
    return std::optional<SchedulerInfo>(std::move(s));
  }
  return std::optional<SchedulerInfo>();
}

std::vector<std::string> ProbeHostNames() {
  std::vector<std::string> names;
  const std::string host = agent::Hostname();
  names.push_back(host);
  if (const std::string s = ShortName(host); s != host) names.push_back(s);
  for (const std::string& addr : agent::LocalAddresses()) {
    if (std::find(names.begin(), names.end(), addr) == names.end()) names.push_back(addr);
  }
  return names;
}

absl::StatusOr<Placement> ResolvePlacement(const JobConfig& job, const PlacementInput& in,
                                           const Env& env,
                                           const std::vector<std::string>& host_names) {
  Placement p;
  DDPRUN_ASSIGN_OR_RETURN(const std::optional<SchedulerInfo> sched,
                          DetectScheduler(env, job.scheduler));
  if (sched) p.warnings = sched->warnings;

  // Node count.
  // A bad count is reported by the resolution, which names its source.
  std::optional<NodeRange> nnodes;
  if (in.nnodes.is_set()) {
    if (auto r = ParseNodeRange(in.nnodes.value); r.ok()) nnodes = *r;
  }
  if (sched && sched->nnodes > 0) {
    const SchedulerInfo& s = *sched;
    if (in.nnodes.is_set()) {
      if (nnodes && (s.nnodes < nnodes->min || s.nnodes > nnodes->max)) {
        return Bad(absl::StrCat(
            in.nnodes.Name("--nnodes"), " asks for ", in.nnodes.value, " nodes but ", s.name,
            " runs this job on ", s.nnodes, " (", s.nnodes_var, "); make them agree: allocate ",
            in.nnodes.value, " nodes, or change the count (--scheduler=none ignores ", s.name,
            ")"));
      }
    } else {
      p.values["nnodes"] = KnobValue{std::to_string(s.nnodes), s.nnodes_var, Origin::kScheduler};
      nnodes = NodeRange{s.nnodes, s.nnodes};
    }
  }
  const int max_nodes = nnodes ? nnodes->max : 1;

  // Node rank.
  if (in.node_rank.is_set()) {
    p.summary = absl::StrCat("node rank from ", in.node_rank.source);
  } else if (!job.hosts.empty()) {
    std::vector<std::string> looked_for;
    std::string how;
    if (in.local_addr.is_set()) {
      looked_for = {in.local_addr.value};
      how = absl::StrCat(in.local_addr.Name("--local_addr"), " ", in.local_addr.value);
    } else {
      looked_for = host_names;
      how = absl::StrCat("this host's names and addresses (",
                         absl::StrJoin(host_names, ", "), ")");
    }
    std::vector<std::size_t> matches;
    for (std::size_t i = 0; i < job.hosts.size(); ++i) {
      for (const std::string& name : looked_for) {
        if (SameHost(job.hosts[i].host, name)) {
          matches.push_back(i);
          break;
        }
      }
    }
    std::vector<std::string> listed;
    for (const HostEntry& h : job.hosts) listed.push_back(h.host);
    if (matches.empty()) {
      return Bad(absl::StrCat(
          job.hosts_location, ": nodes.hosts: this node is not in the list (",
          absl::StrJoin(listed, ", "), "); looked for ", how,
          "; pass --local_addr=ADDR or --node_rank=N, or add this host to nodes.hosts"));
    }
    if (matches.size() > 1) {
      std::vector<std::string> which;
      for (std::size_t i : matches) which.push_back(job.hosts[i].host);
      return Bad(absl::StrCat(job.hosts_location, ": nodes.hosts: this node matches ",
                              absl::StrJoin(which, " and "), " (looked for ", how,
                              "); pass --local_addr=ADDR or --node_rank=N to pick one"));
    }
    const std::size_t i = matches[0];
    const HostEntry& h = job.hosts[i];
    const std::string source = absl::StrCat(h.location, ": nodes.hosts[", i, "] ", h.host);
    if (static_cast<int>(i) < max_nodes) {
      p.values["node_rank"] = KnobValue{std::to_string(i), source, Origin::kHost};
      p.summary = absl::StrCat("node rank ", i, ": matched ", h.host, " by ", how);
    } else {
      p.summary = absl::StrCat("spare: matched ", h.host, " (entry ", i, ", beyond max ", max_nodes,
                               " nodes) by ", how);
    }
    if (!in.local_addr.is_set()) p.values["local_addr"] = KnobValue{h.host, source, Origin::kHost};
  } else if (sched && sched->node_rank >= 0) {
    const SchedulerInfo& s = *sched;
    if (s.node_rank < max_nodes) {
      p.values["node_rank"] =
          KnobValue{std::to_string(s.node_rank), s.rank_var, Origin::kScheduler};
    }
    p.summary = absl::StrCat("node rank from ", s.name, " (", s.rank_var, ")");
  }

  // The rendezvous endpoint: "first_node" names node 0's host.
  const bool is_static = absl::AsciiStrToLower(in.rdzv_backend.value) == "static";
  std::optional<std::pair<std::string, std::string>> first;  // host, where it came from
  if (!job.hosts.empty()) {
    first = std::make_pair(job.hosts[0].host, absl::StrCat(job.hosts[0].location, ": nodes.hosts[0]"));
  } else if (sched && !sched->hosts.empty()) {
    first = std::make_pair(sched->hosts[0], absl::StrCat(sched->hosts_var, " (first host)"));
  }
  const KnobValue& ep = in.rdzv_endpoint;
  const bool first_node = ep.is_set() && (ep.value == "first_node" ||
                                          absl::StartsWith(ep.value, "first_node:"));
  if (first_node) {
    if (!first) {
      return Bad(absl::StrCat(ep.Name("--rdzv_endpoint"),
                              " is first_node but no node list is known; list nodes.hosts, run "
                              "under Slurm, or give HOST:PORT"));
    }
    int port = is_static ? kDefaultMasterPort : kDefaultRdzvPort;
    if (ep.value.size() > 10) {
      auto parsed = ParsePort(ep.value.substr(11));
      if (!parsed.ok()) {
        return Bad(absl::StrCat(ep.Name("--rdzv_endpoint"), " ", parsed.status().message()));
      }
      port = *parsed;
    }
    p.values["rdzv_endpoint"] = KnobValue{rendezvous::FormatHostPort(first->first, port),
                                          absl::StrCat(ep.source, " (first_node: ", first->second, ")"),
                                          ep.origin};
  } else if (!ep.is_set() && max_nodes > 1 && first) {
    p.values["rdzv_endpoint"] = KnobValue{
        rendezvous::FormatHostPort(first->first, is_static ? kDefaultMasterPort : kDefaultRdzvPort),
        absl::StrCat("first_node: ", first->second),
        job.hosts.empty() ? Origin::kScheduler : Origin::kFile};
  }
  return p;
}

bool SchedulerPlacesJob(const Env& env, SchedulerMode mode) {
  if (mode == SchedulerMode::kNone) return false;
  if (mode != SchedulerMode::kAuto) return true;
  auto several = [&](const char* name) {
    const std::string* v = Get(env, name);
    return v != nullptr && absl::StripAsciiWhitespace(*v) != "1";
  };
  const bool slurm_step = Get(env, "SLURM_JOB_ID") && several("SLURM_STEP_NUM_NODES");
  const bool mpi_world = several("OMPI_COMM_WORLD_SIZE") || several("PMI_SIZE");
  return slurm_step || mpi_world;
}

absl::StatusOr<SchedulerPlacement> PlaceFromScheduler(const PlacementInput& in,
                                                      bool master_addr_given, bool job_id_given,
                                                      const Env& env, SchedulerMode mode) {
  SchedulerPlacement out;
  DDPRUN_ASSIGN_OR_RETURN(const std::optional<SchedulerInfo> sched, DetectScheduler(env, mode));
  if (!sched) return out;
  JobConfig job;
  job.scheduler = mode;
  DDPRUN_ASSIGN_OR_RETURN(out.placement, ResolvePlacement(job, in, env, {}));
  auto& values = out.placement.values;
  if (master_addr_given) values.erase("rdzv_endpoint");
  const std::string* job_id = Get(env, "SLURM_JOB_ID");
  if (sched->name == "slurm" && !job_id_given && job_id != nullptr) {
    const std::string* step = Get(env, "SLURM_STEP_ID");
    const std::string id = absl::StrCat("slurm-", *job_id, step ? "-" : "", step ? *step : "");
    if (auto valid = NormalizeKnobValue(KnobNamed("rdzv_id"), id); valid.ok()) {
      values["rdzv_id"] =
          KnobValue{*valid,
                    absl::StrCat("SLURM_JOB_ID=", *job_id,
                                 step ? absl::StrCat(" SLURM_STEP_ID=", *step) : ""),
                    Origin::kScheduler};
    }
  }
  std::vector<std::string> parts;
  if (in.node_rank.is_set()) {
    parts.push_back(absl::StrCat("node rank ", in.node_rank.value, " from ", in.node_rank.source));
  } else if (auto it = values.find("node_rank"); it != values.end()) {
    parts.push_back(absl::StrCat("node rank ", it->second.value, " (", it->second.source, ")"));
  }
  if (auto it = values.find("nnodes"); it != values.end()) {
    parts.push_back(absl::StrCat(it->second.value, " nodes (", it->second.source, ")"));
  }
  if (auto it = values.find("rdzv_endpoint"); it != values.end()) {
    parts.push_back(absl::StrCat("rendezvous at ", it->second.value, " (", it->second.source, ")"));
  }
  if (auto it = values.find("rdzv_id"); it != values.end()) {
    parts.push_back(absl::StrCat("job id ", it->second.value));
  }
  if (!parts.empty()) {
    out.notice = absl::StrCat("ddprun: placed by ", sched->name, ": ", absl::StrJoin(parts, ", "),
                              "; --scheduler=none turns this off");
  }
  return out;
}

}  // namespace ddprun::launcher
