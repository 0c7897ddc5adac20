// Resolution of the merged knobs into AgentOptions. A knob whose row names
// its field is stored by ApplyKnobDests (knob_apply.h); this file resolves
// what spans several knobs. Each value is checked by its parser
// (value_parsers.h), so a message names where the value came from (flag,
// PET_*, file position).
#include "resolve_options.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/agent/cpu_binding.h"
#include "ddprun/agent/gpu_numa.h"
#include "ddprun/agent/grpc_module.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/job_id.h"
#include "ddprun/rendezvous/common/status_macros.h"
#include "ddprun/rendezvous/common/tls.h"
#include "knob_apply.h"

namespace ddprun::launcher {
namespace {

using agent::AgentOptions;
using agent::RendezvousMode;
using rendezvous::kDefaultRdzvPort;

bool FromCommandLine(const KnobValue& v) { return absl::StartsWith(v.source, "--"); }

// --tls_ca/--tls_cert/--tls_key: the files, named as the user gave them
// ("PET_TLS_CA (--tls_ca)"), checked now so that a bad file is a usage error
// before anything starts, and absolute so that workers find them too.
absl::Status ResolveTls(const FlagTable& flags, rendezvous::TlsOptions& tls) {
  auto take = [&](const char* name, std::string& file, std::string& label) {
    const KnobValue v = flags.Get(name);
    label = v.Name(FlagLabel(KnobNamed(name)));
    file = v.value.empty() ? "" : std::filesystem::absolute(v.value).lexically_normal().string();
  };
  take("tls_ca", tls.ca_file, tls.names.ca);
  take("tls_cert", tls.cert_file, tls.names.cert);
  take("tls_key", tls.key_file, tls.names.key);
  if (tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty()) {
    return absl::OkStatus();
  }
  // The checks use OpenSSL, which only the gRPC module links (grpc_module.h);
  // a job with TLS files loads it for its channel anyway.
  DDPRUN_ASSIGN_OR_RETURN(const agent::GrpcModule* module, agent::LoadGrpcModule());
  if (absl::Status st = module->check_client_tls(tls); !st.ok()) {
    return UsageError(st.message());
  }
  return absl::OkStatus();
}

// --web_config: the monitoring port's web configuration, checked now (a bad
// file is a usage error before anything starts) by the gRPC module, which
// links OpenSSL and serves it (grpc_module.h).
absl::Status ResolveWebConfig(const FlagTable& flags, AgentOptions& o) {
  const KnobValue v = flags.Get("web_config");
  if (v.value.empty()) return absl::OkStatus();
  o.web_config_source = v.Name(FlagLabel(KnobNamed("web_config")));
  o.web_config = std::filesystem::absolute(v.value).lexically_normal().string();
  DDPRUN_ASSIGN_OR_RETURN(const agent::GrpcModule* module, agent::LoadGrpcModule());
  if (absl::Status st = module->check_web_config(o.web_config, o.web_config_source); !st.ok()) {
    return UsageError(st.message());
  }
  return absl::OkStatus();
}

// The GPUs a job on this node can use, as torch.cuda.device_count() sees
// them: NVIDIA's (or else AMD's) devices, narrowed by the visibility lists
// their runtimes honour (a Slurm --gres=gpu:4 step on an 8-GPU node sets
// CUDA_VISIBLE_DEVICES to 4 of them).
struct UsableGpus {
  int count = 0;
  int physical = 0;
  std::string hidden_by;  // the variable that narrowed the count, for messages
};
UsableGpus CountUsableGpus(const ResolveContext& ctx) {
  UsableGpus g;
  auto narrow = [&](const char* var) {
    auto it = ctx.env.find(var);
    if (it == ctx.env.end()) return;
    const int visible = VisibleDevices(g.count, it->second);
    if (visible < g.count) g.hidden_by = absl::StrCat(var, "='", it->second, "'");
    g.count = visible;
  };
  g.physical = g.count = GpuCount(ctx.host);
  if (g.physical > 0) {
    narrow("CUDA_VISIBLE_DEVICES");
    return g;
  }
  g.physical = g.count = AmdGpuCount(ctx.host);
  if (g.physical > 0) {
    narrow("ROCR_VISIBLE_DEVICES");
    narrow("HIP_VISIBLE_DEVICES");
    narrow("CUDA_VISIBLE_DEVICES");  // HIP honours it too
  }
  return g;
}

absl::Status ResolveShape(const ResolveContext& ctx, ParsedCommand& out) {
  const FlagTable& flags = ctx.flags;
  AgentOptions& o = out.options;
  DDPRUN_ASSIGN_OR_RETURN(NodeRange nodes, ParseKnob(flags, KnobNamed("nnodes"), ParseNodeRange));
  o.min_nodes = nodes.min;
  o.max_nodes = nodes.max;

  const Knob& nproc_knob = KnobNamed("nproc_per_node");
  DDPRUN_ASSIGN_OR_RETURN(NprocSpec nproc, ParseKnob(flags, nproc_knob, ParseNproc));
  const int cpus = std::max(1, ctx.host.cpu_count);
  switch (nproc.kind) {
    case NprocSpec::Kind::kNumber:
      o.nproc_per_node = nproc.number;
      break;
    case NprocSpec::Kind::kCpu:
      o.nproc_per_node = cpus;
      break;
    case NprocSpec::Kind::kAuto:
    case NprocSpec::Kind::kGpu: {
      const UsableGpus gpus = CountUsableGpus(ctx);
      if (nproc.kind == NprocSpec::Kind::kAuto) {
        o.nproc_per_node = gpus.count > 0 ? gpus.count : cpus;
        break;
      }
      if (gpus.count <= 0) {
        return UsageError(absl::StrCat(
            flags.Get("nproc_per_node").Name("--nproc_per_node"), "=gpu but ",
            gpus.physical > 0
                ? absl::StrCat(gpus.hidden_by, " hides all ", gpus.physical, " GPU(s) of this node")
                : "no GPU found (no /proc/driver/nvidia/gpus entries, "
                  "/dev/nvidia<N> devices or ROCm KFD GPU nodes)",
            "; pass a number of workers, 'cpu' or 'auto'"));
      }
      o.nproc_per_node = gpus.count;
      break;
    }
    case NprocSpec::Kind::kXpu: {
      // As torchrun 2.x's torch.xpu.device_count(), read from sysfs.
      const int physical = IntelGpuCount(ctx.host);
      auto mask = ctx.env.find("ZE_AFFINITY_MASK");
      const int usable =
          mask == ctx.env.end() ? physical : ZeAffinityDevices(physical, mask->second);
      if (usable <= 0) {
        return UsageError(absl::StrCat(
            flags.Get("nproc_per_node").Name("--nproc_per_node"), "=xpu but ",
            physical > 0 ? absl::StrCat("ZE_AFFINITY_MASK='", mask->second, "' hides all ",
                                        physical, " Intel GPU(s) of this node")
                         : "no Intel GPU found (no /sys/class/drm/card<N> with vendor 0x8086 "
                           "and a render node)",
            "; pass a number of workers, 'cpu' or 'auto'"));
      }
      o.nproc_per_node = usable;
      break;
    }
  }

  // --grace_period and --shutdown_timeout (ChooseGracePeriod); given both as
  // flags, they must agree.
  const KnobValue grace = flags.Get("grace_period");
  const KnobValue shutdown = flags.Get("shutdown_timeout");
  if (shutdown.origin == Origin::kFlag && grace.origin == Origin::kFlag) {
    auto a = ParseSeconds(grace.value, /*allow_zero=*/true);
    auto b = ParseSeconds(shutdown.value, /*allow_zero=*/true);
    if (a.ok() && b.ok() && a->count() != b->count()) {
      return UsageError(absl::StrCat("--grace_period=", grace.value,
                                     " and --shutdown_timeout=", shutdown.value,
                                     " name the same setting with different values; give one"));
    }
  }
  const GracePeriodSource source =
      ChooseGracePeriod([&](const std::string& dest) { return flags.Get(dest); }, ctx.env);
  auto seconds = ParseSeconds(source.value.value, /*allow_zero=*/true);
  if (!seconds.ok()) return BadValue(source.value, KnobNamed(source.knob), seconds.status());
  o.grace_period_s = seconds->count();

  DDPRUN_ASSIGN_OR_RETURN(std::string cpu_bind,
                          ParseKnob(flags, KnobNamed("cpu_bind"), ParseCpuBind));
  o.cpu_bind = *agent::CpuBindFromName(cpu_bind);
  // Checked here, once, so that a policy this node cannot meet is a usage
  // error before anything starts (the agent plans again at every spawn).
  if (auto plan = agent::PlanCpuBinding(o.cpu_bind, o.nproc_per_node,
                                        [&] { return CpuTopologyOf(ctx.host); });
      !plan.ok()) {
    return UsageError(absl::StrCat(flags.Get("cpu_bind").Name("--cpu_bind"), "=", cpu_bind, ": ",
                                   plan.status().message()));
  }

  if (const KnobValue numa = flags.Get("numa_binding"); numa.is_set()) {
    const std::optional<agent::NumaBinding> mode = agent::NumaBindingFromName(numa.value);
    if (!mode) {
      return UsageError(absl::StrCat(numa.Name("--numa_binding"), " must be ",
                                     agent::kNumaBindingChoices, ", got '", numa.value,
                                     "' (e.g. --numa_binding=node)"));
    }
    if (o.cpu_bind != agent::CpuBind::kNone) {
      return UsageError(absl::StrCat(numa.Name("--numa_binding"), " and ",
                                     flags.Get("cpu_bind").Name("--cpu_bind"), "=", cpu_bind,
                                     " both choose the workers' CPUs; give one"));
    }
    o.numa_binding = *mode;
  }

  DDPRUN_ASSIGN_OR_RETURN(SignalSet signals,
                          ParseKnob(flags, KnobNamed("signals_to_handle"), ParseSignals));
  o.stop_on_sigusr1 = signals.usr1;
  o.stop_on_sigusr2 = signals.usr2;
  o.signals_to_handle =
      absl::StrCat("SIGTERM,SIGINT,SIGHUP,SIGQUIT", signals.usr1 ? ",SIGUSR1" : "",
                   signals.usr2 ? ",SIGUSR2" : "");
  for (const std::string& sig : signals.unhandled) {
    out.warnings.push_back(absl::StrCat(
        "ddprun: ", flags.Get("signals_to_handle").Name("--signals_to_handle"), " lists ", sig,
        ", which ddprun does not trap (it handles SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and "
        "SIGUSR2); ignored"));
  }
  // --forward_signals: SIGUSR1/SIGUSR2 only; they go to the workers and the job runs on.
  const KnobValue fw = flags.Get("forward_signals");
  if (fw.is_set()) {
    DDPRUN_ASSIGN_OR_RETURN(SignalSet forward,
                            ParseKnob(flags, KnobNamed("forward_signals"), ParseSignals));
    std::vector<std::string> others = forward.terminating;
    others.insert(others.end(), forward.unhandled.begin(), forward.unhandled.end());
    if (!others.empty()) {
      return UsageError(absl::StrCat(fw.Name("--forward_signals"), " lists ", others.front(),
                                     ": only SIGUSR1 and SIGUSR2 can be forwarded while the "
                                     "job runs; the others stop it (--signals_to_handle)"));
    }
    o.forward_sigusr1 = forward.usr1;
    o.forward_sigusr2 = forward.usr2;
  }

  // --virtual_local_rank: each worker's own GPU must exist in the list it
  // would get one of (torchrun raises at spawn; here, before anything starts).
  if (o.virtual_local_rank) {
    if (auto it = ctx.env.find("CUDA_VISIBLE_DEVICES"); it != ctx.env.end()) {
      const std::vector<std::string> devices = absl::StrSplit(it->second, ',');
      if (static_cast<int>(devices.size()) < o.nproc_per_node) {
        return UsageError(absl::StrCat(flags.Get("virtual_local_rank").Name("--virtual_local_rank"),
                                       " gives each worker its "
                                       "own entry of CUDA_VISIBLE_DEVICES='",
                                       it->second, "', which has ", devices.size(), " for ",
                                       o.nproc_per_node,
                                       " workers; list one device per worker or lower "
                                       "--nproc_per_node"));
      }
    }
  }

  DDPRUN_ASSIGN_OR_RETURN(bool no_hook, flags.GetBool("no_python_hook"));
  o.python_hook = !no_hook;

  if (const KnobValue specs = flags.Get("logs_specs"); specs.is_set()) {
    return UsageError(absl::StrCat(
        specs.Name("--logs_specs"), "=", specs.value,
        ": torchrun's log layout plugins (Python entry points) are not supported; ddprun writes "
        "torchrun's default layout under --log_dir, so drop --logs_specs"));
  }
  return absl::OkStatus();
}

// torchrun's --duplicate-std{out,err}-filters value: substrings separated by
// ',', where ',,' stands for a comma inside one; empty items are dropped.
std::vector<std::string> SplitFilters(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      cur += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      cur += ',';
      ++i;
    } else {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

absl::Status ResolveOutput(const ResolveContext& ctx, ParsedCommand& out) {
  const FlagTable& flags = ctx.flags;
  AgentOptions& o = out.options;
  o.log_dir = flags.Get("log_dir").value;
  // --local_ranks_filter against --nproc_per_node.
  const Knob& filter = KnobNamed("local_ranks_filter");
  for (int r : out.launcher.local_ranks_filter) {
    if (r >= o.nproc_per_node) {
      return UsageError(absl::StrCat(flags.Get(filter.name).Name(FlagLabel(filter)),
                                     " names local rank ", r, " but --nproc_per_node is ",
                                     o.nproc_per_node, "; use ranks 0..", o.nproc_per_node - 1));
    }
  }
  o.logs.redirects = out.launcher.redirects;
  o.logs.tee = out.launcher.tee;
  o.logs.local_ranks_filter = out.launcher.local_ranks_filter;
  for (auto [name, list] : {std::pair{"duplicate_stdout_filters", &o.logs.stdout_filters},
                            std::pair{"duplicate_stderr_filters", &o.logs.stderr_filters}}) {
    const KnobValue v = flags.Get(name);
    if (!v.is_set()) continue;
    *list = SplitFilters(v.value);
    if (list->empty()) {
      return UsageError(absl::StrCat(v.Name(absl::StrCat("--", name)),
                                     " names no text; give "
                                     "substrings separated by commas, e.g. --",
                                     name, "=loss,error"));
    }
  }
  // Else the agent reads TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else torchrun's default.
  o.logs.prefix_template = flags.Get("log_line_prefix_template").value;
  return absl::OkStatus();
}

// --rdzv_conf k=v,... (and the file's rendezvous keys, a layer below it).
// Our keys set options; torchrun's other keys are accepted with a warning so
// that torchrun command lines keep working.
absl::Status ApplyRdzvConf(const KnobValue& s, bool is_static, ParsedCommand& out) {
  AgentOptions& options = out.options;
  std::vector<std::string>& warnings = out.warnings;
  static const std::set<std::string> kTorchrunOnly = {"close_timeout",
                                                      "heartbeat_timeout",
                                                      "keep_alive_interval",
                                                      "keep_alive_max_attempt",
                                                      "read_timeout",
                                                      "store_type",
                                                      "rank",
                                                      "timeout",
                                                      "use_libuv",
                                                      "local_addr"};
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
    const KnobValue sub{value, s.source, s.origin};
    auto seconds = [&](const Knob& knob) -> absl::StatusOr<double> {
      auto v = ParseSeconds(value, knob.type == ValueType::kSeconds);
      if (!v.ok()) return BadValue(sub, knob, v.status());
      return v->count();
    };
    if (const Knob* knob = FindRdzvConfKnob(key);
        knob != nullptr && !std::holds_alternative<std::monostate>(knob->dest)) {
      // join_timeout, last_call_timeout: the row says where it goes.
      DDPRUN_RETURN_IF_ERROR(ApplyKnobValue(*knob, sub, out));
      if (key == "join_timeout") join_timeout_set = true;
    } else if (key == "token") {
      options.join_token = value;  // as given, even empty (ParseToken would refuse it)
    } else if (key == "is_host") {
      auto b = ParseBool(value);
      if (!b.ok()) {
        return UsageError(absl::StrCat(s.Name("--rdzv_conf"), " is_host ", b.status().message(),
                                       " (e.g. is_host=true on the node behind the endpoint)"));
      }
      options.is_host = *b;
    } else if (key == "timeout" && is_static) {
      // static's TCPStore timeout: how long nodes wait for each other; checked
      // like join_timeout.
      DDPRUN_ASSIGN_OR_RETURN(static_timeout, seconds(*FindRdzvConfKnob("join_timeout")));
    } else if (kTorchrunOnly.count(key) > 0) {
      warnings.push_back(absl::StrCat("ddprun: --rdzv_conf key '", key,
                                      "' is a torchrun setting that ddprun does not use; ignored"));
    } else {
      // torchrun passes any key through to its backend (Kubeflow sets its
      // own), so an unknown key is a warning, never a failure.
      warnings.push_back(absl::StrCat("ddprun: ", s.Name("--rdzv_conf"), " key '", key,
                                      "' is unknown to ddprun and torchrun's c10d backend; "
                                      "ignored (ddprun's keys: join_timeout, last_call_timeout, "
                                      "token)"));
    }
  }
  if (static_timeout && !join_timeout_set) options.policy.join_timeout_s = *static_timeout;
  return absl::OkStatus();
}

// A single-node job's private rendezvous on 127.0.0.1, the port the OS picks;
// the job id given, else a random one (concurrent jobs never collide).
absl::Status UseEmbeddedRendezvous(const FlagTable& flags, AgentOptions& o) {
  o.mode = RendezvousMode::kEmbedded;
  o.rdzv_host = "127.0.0.1";
  o.rdzv_port = 0;
  if (flags.Get("rdzv_id").is_set()) {
    DDPRUN_ASSIGN_OR_RETURN(o.job_id, ParseKnob(flags, KnobNamed("rdzv_id"), ParseJobIdValue));
  } else {
    o.job_id = rendezvous::RandomJobId();
  }
  return absl::OkStatus();
}

absl::Status ResolveRendezvous(const ResolveContext& ctx, ParsedCommand& out) {
  const FlagTable& flags = ctx.flags;
  AgentOptions& o = out.options;
  std::vector<std::string>& warnings = out.warnings;
  DDPRUN_ASSIGN_OR_RETURN(const bool standalone, flags.GetBool("standalone"));
  const KnobValue backend = flags.Get("rdzv_backend");
  const KnobValue endpoint = flags.Get("rdzv_endpoint");
  const KnobValue rdzv_id = flags.Get("rdzv_id");
  const KnobValue node_rank = flags.Get("node_rank");
  const KnobValue master_addr = flags.Get("master_addr");
  const KnobValue master_port = flags.Get("master_port");
  o.local_addr = flags.Get("local_addr").value;
  DDPRUN_RETURN_IF_ERROR(ResolveTls(flags, o.tls));
  DDPRUN_RETURN_IF_ERROR(ResolveWebConfig(flags, o));

  DDPRUN_ASSIGN_OR_RETURN(const std::string backend_name,
                          ParseKnob(flags, KnobNamed("rdzv_backend"), ParseBackend));
  // torchrun's default backend is static: a command line that names the
  // master (--master_addr/--master_port or their PET_*) and no backend,
  // endpoint or --standalone runs as under torchrun, with node rank 0
  // hosting the store on --master_port.
  const bool torchrun_static = !backend.is_set() && !endpoint.is_set() && !standalone &&
                               (master_addr.is_set() || master_port.is_set());
  const bool is_static = (backend_name == "static" || torchrun_static) && !standalone;

  // The file's --rdzv_conf keys first; a --rdzv_conf flag or PET_RDZV_CONF
  // then overrides the keys it names.
  if (ctx.job != nullptr) {
    std::vector<std::string> file_conf;
    for (const Knob& k : kKnobs) {
      if (k.rdzv_conf == nullptr) continue;
      if (const KnobValue* f = flags.File(k.Dest())) {
        file_conf.push_back(absl::StrCat(k.rdzv_conf, "=", f->value));
      }
    }
    const KnobValue file_setting{absl::StrJoin(file_conf, ","), ctx.job->path + ": rendezvous",
                                 Origin::kFile};
    DDPRUN_RETURN_IF_ERROR(ApplyRdzvConf(file_setting, is_static, out));
  }
  DDPRUN_RETURN_IF_ERROR(ApplyRdzvConf(flags.Get("rdzv_conf"), is_static, out));

  const std::string nnodes_text = FormatNodeRange({o.min_nodes, o.max_nodes});
  if (node_rank.is_set()) {
    const Knob& knob = KnobNamed("node_rank");
    DDPRUN_ASSIGN_OR_RETURN(long rank, ParseKnob(flags, knob, [&](const std::string& s) {
                              return ParseCount(s, knob.min, knob.max, knob.what);
                            }));
    if (rank >= o.max_nodes) {
      return BadValue(node_rank, knob,
                      absl::InvalidArgumentError(absl::StrCat("must be in 0..", o.max_nodes - 1,
                                                              " (--nnodes max is ", o.max_nodes,
                                                              "), got '", node_rank.value, "'")));
    }
    o.node_rank = static_cast<int>(rank);
  }

  if (standalone) {
    std::vector<std::string> ignored;
    for (const KnobValue* s : {&backend, &endpoint, &rdzv_id}) {
      if (FromCommandLine(*s)) ignored.push_back(s->source);
    }
    if (!ignored.empty()) {
      warnings.push_back(
          absl::StrCat("ddprun: --standalone ignores ", absl::StrJoin(ignored, ", ")));
    }
    if (o.max_nodes > 1) {
      return UsageError(absl::StrCat("--standalone runs a single node but --nnodes is ",
                                     nnodes_text, "; drop --standalone and pass --rdzv_endpoint"));
    }
    o.mode = RendezvousMode::kEmbedded;
    o.job_id = rendezvous::RandomJobId();
    o.rdzv_host = "127.0.0.1";
    o.rdzv_port = 0;
    return absl::OkStatus();
  }

  if (is_static) {
    if (o.min_nodes != o.max_nodes) {
      return UsageError(
          absl::StrCat("--rdzv_backend=static needs a fixed number of nodes but "
                       "--nnodes is ",
                       nnodes_text, "; pass --nnodes=N, or use c10d for an elastic job"));
    }
    // Several nodes that do not know who is node 0, or where it is, would
    // each wait for a store that never comes: refuse up front.
    if (o.max_nodes > 1 && !node_rank.is_set()) {
      return UsageError(absl::StrCat("static rendezvous with --nnodes=", nnodes_text,
                                     " needs this node's --node_rank (0 on the node that hosts "
                                     "the store, 1..",
                                     o.max_nodes - 1, " on the others)"));
    }
    if (o.max_nodes > 1 && !endpoint.is_set() && !master_addr.is_set()) {
      return UsageError(absl::StrCat("static rendezvous with --nnodes=", nnodes_text,
                                     " needs --master_addr=HOST (node rank 0's address) on every "
                                     "node; without it each node looks for the store on "
                                     "127.0.0.1"));
    }
    o.mode = RendezvousMode::kStatic;
    DDPRUN_ASSIGN_OR_RETURN(o.job_id, ParseKnob(flags, KnobNamed("rdzv_id"), ParseJobIdValue));
    if (!node_rank.is_set()) o.node_rank = 0;
    if (endpoint.is_set()) {
      // torchrun: with static, --rdzv_endpoint replaces --master_addr/--master_port.
      DDPRUN_ASSIGN_OR_RETURN(
          rendezvous::HostPort hp,
          ParseKnob(flags, KnobNamed("rdzv_endpoint"),
                    [](const std::string& s) { return ParseEndpoint(s, /*default_port=*/-1); }));
      if (FromCommandLine(master_addr) || FromCommandLine(master_port)) {
        warnings.push_back(
            "ddprun: --rdzv_endpoint overrides --master_addr/--master_port with the static "
            "backend");
      }
      o.master_addr = hp.host;
      o.master_port = hp.port;
    } else {
      DDPRUN_ASSIGN_OR_RETURN(o.master_addr, ParseKnob(flags, KnobNamed("master_addr"), ParseText));
      DDPRUN_ASSIGN_OR_RETURN(o.master_port, ParseKnob(flags, KnobNamed("master_port"), ParsePort));
    }
    return absl::OkStatus();
  }

  if (FromCommandLine(master_addr) || FromCommandLine(master_port)) {
    warnings.push_back(
        "ddprun: --master_addr/--master_port are only used with --rdzv_backend=static; "
        "ignored");
  }
  if (endpoint.is_set() && absl::StrContains(endpoint.value, ',')) {
    DDPRUN_ASSIGN_OR_RETURN(o.rdzv_replicas,
                            ParseKnob(flags, KnobNamed("rdzv_endpoint"), [](const std::string& s) {
                              return ParseEndpointList(s, kDefaultRdzvPort);
                            }));
    o.mode = RendezvousMode::kRemote;
    o.rdzv_host = o.rdzv_replicas[0].host;
    o.rdzv_port = o.rdzv_replicas[0].port;
    DDPRUN_ASSIGN_OR_RETURN(o.job_id, ParseKnob(flags, KnobNamed("rdzv_id"), ParseJobIdValue));
    return absl::OkStatus();
  }
  if (endpoint.is_set()) {
    DDPRUN_ASSIGN_OR_RETURN(rendezvous::HostPort hp,
                            ParseKnob(flags, KnobNamed("rdzv_endpoint"), [](const std::string& s) {
                              return ParseEndpoint(s, kDefaultRdzvPort, /*allow_zero_port=*/true);
                            }));
    if (hp.port == 0) {
      // torchrun's "HOST:0": this node hosts the rendezvous on a port the OS
      // picks, which no other node could find: a single-node job.
      if (o.max_nodes > 1) {
        return UsageError(absl::StrCat(
            endpoint.Name("--rdzv_endpoint"), "=", endpoint.value,
            ": port 0 lets the OS pick the port, which the other nodes cannot know; it is for a "
            "single-node job (--nnodes=1). Give the nodes a port, e.g. ",
            rendezvous::FormatHostPort({hp.host, kDefaultRdzvPort})));
      }
      return UseEmbeddedRendezvous(flags, o);
    }
    o.mode = RendezvousMode::kRemote;
    o.rdzv_host = hp.host;
    o.rdzv_port = hp.port;
    DDPRUN_ASSIGN_OR_RETURN(o.job_id, ParseKnob(flags, KnobNamed("rdzv_id"), ParseJobIdValue));
    return absl::OkStatus();
  }
  if (o.max_nodes > 1) {
    return UsageError(
        absl::StrCat("--nnodes=", nnodes_text,
                     " needs a rendezvous shared by the nodes: start ddprund on one host and pass "
                     "--rdzv_endpoint=HOST:",
                     kDefaultRdzvPort,
                     " to every node, or give every node --master_addr=HOST of node rank 0 and its "
                     "--node_rank (static)"));
  }
  return UseEmbeddedRendezvous(flags, o);
}

}  // namespace

GracePeriodSource ChooseGracePeriod(const std::function<KnobValue(const std::string&)>& lookup,
                                    const agent::Env& env) {
  auto weight = [](const KnobValue& v) {
    return v.origin == Origin::kFlag ? 2 : v.origin == Origin::kEnv ? 1 : 0;
  };
  GracePeriodSource s{lookup("grace_period"), "grace_period"};
  if (const KnobValue shutdown = lookup("shutdown_timeout");
      shutdown.is_set() && weight(shutdown) > weight(s.value)) {
    s = {shutdown, "shutdown_timeout"};
  }
  if (weight(s.value) == 0) {
    if (auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
        it != env.end() && !it->second.empty()) {
      s.value = {it->second, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", Origin::kEnv};
    }
  }
  return s;
}

// --restart_policy=inplace restarts a failed worker into its rank, which is
// a restart counted against --max_restarts: with none allowed the first
// failure ends the job, so the pair is refused rather than silently meant.
absl::Status CheckRestartPolicy(const FlagTable& flags, const agent::AgentOptions& o) {
  if (o.policy.restart_policy != rendezvous::RestartPolicy::kInplace || o.policy.max_restarts > 0) {
    return absl::OkStatus();
  }
  return UsageError(absl::StrCat(
      flags.Get("restart_policy").Name("--restart_policy"), "=inplace needs ",
      flags.Get("max_restarts").Name("--max_restarts"),
      " >= 1 (each in-place restart counts against it); pass --max_restarts=N, or drop "
      "--restart_policy"));
}

absl::Status ResolveOptions(const ResolveContext& ctx, ParsedCommand& out) {
  // The knobs whose rows name their field (knobs.h); what follows spans
  // several knobs.
  DDPRUN_RETURN_IF_ERROR(ApplyKnobDests(ctx.flags, out));
  DDPRUN_RETURN_IF_ERROR(CheckRestartPolicy(ctx.flags, out.options));
  DDPRUN_RETURN_IF_ERROR(ResolveShape(ctx, out));
  DDPRUN_RETURN_IF_ERROR(ResolveOutput(ctx, out));
  return ResolveRendezvous(ctx, out);
}

void ApplyFileEnvironment(const JobConfig& job, const agent::Env& env, agent::AgentOptions& o,
                          std::vector<std::string>& warnings) {
  for (const auto* list : {&job.nccl, &job.env_set}) {
    for (const auto& [name, value] : *list) {
      if (auto it = env.find(name); it != env.end() && !it->second.empty()) continue;
      o.extra_env[name] = value.text;
    }
  }
  for (const FileValue& pass : job.env_pass) {
    if (env.find(pass.text) == env.end()) {
      warnings.push_back(absl::StrCat("ddprun: ", pass.Source(), ": ", pass.text,
                                      " is not set on this node, so workers do not get it"));
    }
  }
}

}  // namespace ddprun::launcher
