// --print-config: the merged job with the origin of every value.
#include "ddprun/launcher/print_config.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/knobs.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "resolve_options.h"

namespace ddprun::launcher {
namespace {

std::string Number(double v) { return absl::StrFormat("%g", v); }

std::string From(const KnobValue& k) {
  if (k.origin == Origin::kDefault || k.source.empty()) return "default";
  return absl::StrCat(OriginName(k.origin), " ", k.source);
}

void Line(std::string& out, const std::string& key, const std::string& value,
          const std::string& from) {
  // A value no knob set directly (the placement) is worked out from others.
  absl::StrAppendFormat(&out, "%-30s = %-36s # %s\n", key, value,
                        from.empty() ? "derived from the values above" : from);
}

}  // namespace

std::string RenderMergedConfig(const MergedJobView& v) {
  const agent::AgentOptions& o = *v.options;
  const std::map<std::string, std::string>& env = *v.env;
  std::string out =
      "# ddprun --print-config: the merged job (nothing was started).\n"
      "# Each value comes from the first of: flag > env (PET_*, NCCL_*, ...) > file > default.\n";
  if (v.job != nullptr) {
    Line(out, "config", v.job->path, "flag --config");
    if (!v.job->name.empty()) Line(out, "job.name", v.job->name, "file");
  }
  for (const Knob& k : kKnobs) {
    if (k.type == ValueType::kFileOnly || k.type == ValueType::kRdzvConf) continue;
    const std::string flag = k.Dest();
    if (flag == "config" || flag == "print_config") continue;
    const std::string label = k.yaml_key ? k.yaml_key : absl::StrCat("--", flag);
    KnobValue from = v.lookup(k.is_flag() ? flag : "rdzv_conf");
    if (k.rdzv_conf != nullptr) {
      // A --rdzv_conf key: the flag/env string if it names it, else the file.
      const bool named =
          from.is_set() && from.origin != Origin::kFile &&
          absl::StrContains(absl::StrCat(",", from.value), absl::StrCat(",", k.rdzv_conf, "="));
      if (!named) from = v.lookup(flag);
    }
    if (flag == "grace_period") from = ChooseGracePeriod(v.lookup, env).value;
    if ((flag == "rdzv_backend" || flag == "rdzv_endpoint") && !from.is_set() &&
        o.mode == agent::RendezvousMode::kStatic) {
      // torchrun's default backend: static, selected by naming the master.
      KnobValue master = v.lookup("master_addr");
      if (!master.is_set()) master = v.lookup("master_port");
      if (master.is_set()) {
        from = KnobValue{"", absl::StrCat(master.source, " (torchrun's static default)"),
                         master.origin};
      }
    }
    std::string value = from.value;
    if (flag == "rdzv_id") {
      value = o.job_id;
    } else if (flag == "nnodes") {
      value = o.min_nodes == o.max_nodes ? std::to_string(o.max_nodes)
                                         : absl::StrCat(o.min_nodes, ":", o.max_nodes);
    } else if (flag == "node_rank") {
      value = o.node_rank < 0 ? "any" : std::to_string(o.node_rank);
    } else if (flag == "nproc_per_node") {
      value = from.value == std::to_string(o.nproc_per_node)
                  ? from.value
                  : absl::StrCat(o.nproc_per_node, " (", from.value, ")");
    } else if (flag == "role") {
      value = o.role;
    } else if (flag == "max_restarts") {
      value = std::to_string(o.policy.max_restarts);
    } else if (flag == "grace_period") {
      value = Number(o.grace_period_s);
    } else if (flag == "rdzv_backend") {
      value = o.mode == agent::RendezvousMode::kStatic ? "static" : "c10d";
    } else if (flag == "rdzv_endpoint") {
      switch (o.mode) {
        case agent::RendezvousMode::kEmbedded:
          value = "none (this node hosts a private rendezvous)";
          break;
        case agent::RendezvousMode::kRemote:
          value = rendezvous::FormatHostPort(o.rdzv_host, o.rdzv_port);
          break;
        case agent::RendezvousMode::kStatic:
          value = absl::StrCat(rendezvous::FormatHostPort(o.master_addr, o.master_port),
                               " (static master)");
          break;
      }
    } else if (flag == "rdzv_conf.join_timeout") {
      value = Number(o.policy.join_timeout_s);
    } else if (flag == "rdzv_conf.last_call_timeout") {
      value = Number(o.policy.last_call_timeout_s);
    } else if (flag == "rdzv_conf.token") {
      value = o.join_token.empty() ? "none" : "(set, not shown)";
    } else if (flag == "local_addr") {
      value = o.local_addr.empty() ? absl::StrCat("(", k.default_text, ")") : o.local_addr;
    } else if (flag == "log_dir") {
      value = o.log_dir.empty() ? absl::StrCat("(", k.default_text, ")") : o.log_dir;
    } else if (value.empty()) {
      value = k.default_text;
    }
    Line(out, label, value, From(from));
  }
  Line(out, "command", absl::StrJoin(o.command, " "), From(v.command_from));
  if (const PythonChoice py = ChoosePython(env, SelfExe());
      !o.command.empty() && o.command[0] == py.path) {
    Line(out, "python", py.path, py.why);
  }
  if (!v.placement.empty()) Line(out, "placement", v.placement, "");

  // What every worker gets on top of the node's environment.
  std::set<std::string> shown;
  auto var = [&](const std::string& section, const std::string& name, const FileValue* file) {
    shown.insert(name);
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) {
      Line(out, absl::StrCat(section, ".", name), it->second, absl::StrCat("env ", name));
    } else if (file != nullptr) {
      Line(out, absl::StrCat(section, ".", name), file->text,
           absl::StrCat("file ", file->Source()));
    } else {
      Line(out, absl::StrCat(section, ".", name), "(not set on this node)", "env");
    }
  };
  if (v.job != nullptr) {
    for (const auto& [name, fv] : v.job->env_set) var("environment", name, &fv);
    for (const FileValue& p : v.job->env_pass) var("environment", p.text, nullptr);
    for (const auto& [name, fv] : v.job->nccl) var("nccl", name, &fv);
  }
  for (const auto& [name, value] : env) {
    if (absl::StartsWith(name, "NCCL_") && shown.count(name) == 0) var("nccl", name, nullptr);
  }
  return out;
}

}  // namespace ddprun::launcher
