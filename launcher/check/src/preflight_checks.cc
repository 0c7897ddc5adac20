// The checks of `ddprun check` (preflight.h): each a pure function from the
// facts of the nodes to a verdict, its detail and its fix.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/launcher/check/preflight.h"

namespace ddprun::launcher::preflight {
namespace {

CheckResult Make(std::string_view check, const NodeFacts& node, Verdict v, std::string detail,
                 std::string fix = "") {
  return {std::string(check), node.group_rank, v, std::move(detail), std::move(fix)};
}

std::string Bytes(std::int64_t b) {
  if (b < 0) return "unlimited";
  if (b >= 1024 * kMiB) return absl::StrFormat("%.1f GiB", static_cast<double>(b) / (1024 * kMiB));
  if (b >= kMiB) return absl::StrFormat("%.0f MiB", static_cast<double>(b) / kMiB);
  return absl::StrCat(b / 1024, " KiB");
}

std::string Workers(int n) { return absl::StrCat(n, n == 1 ? " worker" : " workers"); }

std::string NodeName(const NodeFacts& n) {
  return absl::StrCat("node ", n.group_rank, " (", n.host.empty() ? n.hostname : n.host, ")");
}

const std::string* EnvOf(const NodeFacts& n, const std::string& key) {
  auto it = n.env.find(key);
  return it == n.env.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------

class ReportedCheck final : public Check {
 public:
  std::string_view Name() const override { return "reported"; }
  CheckResult Run(const NodeFacts& n, const std::vector<NodeFacts>&,
                  const JobFacts&) const override {
    if (n.reported) return Make(Name(), n, Verdict::kPass, "results received");
    return Make(Name(), n, Verdict::kFail,
                absl::StrCat("sent no results", n.error.empty() ? "" : ": ", n.error),
                "see that node's stderr; it must reach node 0's store (MASTER_ADDR:MASTER_PORT) "
                "within --check_timeout");
  }
};

// Cross-node equality with node 0.
class SameAsNodeZero : public Check {
 public:
  CheckResult Run(const NodeFacts& n, const std::vector<NodeFacts>& all,
                  const JobFacts& job) const override {
    if (!n.reported) return Make(Name(), n, Verdict::kNotApplicable, "no facts");
    return Compare(n, all.empty() ? n : all[0], job);
  }

 protected:
  virtual CheckResult Compare(const NodeFacts& n, const NodeFacts& ref, const JobFacts&) const = 0;
};

class DdprunVersionCheck final : public SameAsNodeZero {
 public:
  std::string_view Name() const override { return "ddprun_version"; }
  CheckResult Compare(const NodeFacts& n, const NodeFacts& ref, const JobFacts&) const override {
    if (n.ddprun_version == ref.ddprun_version) {
      return Make(Name(), n, Verdict::kPass, n.ddprun_version);
    }
    return Make(
        Name(), n, Verdict::kFail,
        absl::StrCat(n.ddprun_version, ", but ", NodeName(ref), " runs ", ref.ddprun_version),
        absl::StrCat("install the same ddprun on every node (", ref.ddprun_version, ")"));
  }
};

class ScriptCheck final : public SameAsNodeZero {
 public:
  std::string_view Name() const override { return "script"; }
  CheckResult Compare(const NodeFacts& n, const NodeFacts& ref, const JobFacts&) const override {
    if (n.script_path.empty()) {
      return Make(Name(), n, Verdict::kNotApplicable, "no script file (python -m MODULE)");
    }
    if (!n.script_error.empty()) {
      return Make(Name(), n, Verdict::kFail, absl::StrCat(n.script_path, ": ", n.script_error),
                  "copy the script to this node at the same path, or use a shared file system");
    }
    const std::string sum = n.script_sha256.substr(0, 12);
    if (n.group_rank == ref.group_rank || n.script_sha256 == ref.script_sha256) {
      return Make(Name(), n, Verdict::kPass, absl::StrCat(n.script_path, " sha256 ", sum));
    }
    return Make(Name(), n, Verdict::kFail,
                absl::StrCat(n.script_path, " sha256 ", sum, " differs from ", NodeName(ref), "'s ",
                             ref.script_path, " sha256 ", ref.script_sha256.substr(0, 12)),
                absl::StrCat("copy ", NodeName(ref), "'s ", ref.script_path,
                             " to this node (or use a shared file system)"));
  }
};

class PythonCheck final : public SameAsNodeZero {
 public:
  std::string_view Name() const override { return "python"; }
  CheckResult Compare(const NodeFacts& n, const NodeFacts& ref, const JobFacts&) const override {
    if (!n.python_command) {
      return Make(Name(), n, Verdict::kNotApplicable, "the command is not a Python script");
    }
    if (!n.python_error.empty()) {
      return Make(Name(), n, Verdict::kFail, n.python_error,
                  "install Python 3 on this node or set PYTHON_EXEC to it");
    }
    const std::string mine = absl::StrCat("Python ", n.python_version);
    if (n.python_version == ref.python_version || !ref.python_error.empty()) {
      return Make(Name(), n, Verdict::kPass, mine);
    }
    return Make(Name(), n, Verdict::kFail,
                absl::StrCat(mine, ", but ", NodeName(ref), " has Python ", ref.python_version),
                absl::StrCat("install the same Python on every node (", ref.python_version,
                             "), e.g. one container image or environment"));
  }
};

// PyTorch's version, as `import torch` in the job's interpreter sees it.
class TorchCheck final : public SameAsNodeZero {
 public:
  std::string_view Name() const override { return "torch"; }
  CheckResult Compare(const NodeFacts& n, const NodeFacts& ref, const JobFacts&) const override {
    if (!n.python_command) {
      return Make(Name(), n, Verdict::kNotApplicable, "the command is not a Python script");
    }
    if (!n.python_error.empty()) {
      return Make(Name(), n, Verdict::kNotApplicable, "Python did not run (see python)");
    }
    const auto text = [](const NodeFacts& f) {
      return f.torch_version.empty() ? std::string("no torch") : "torch " + f.torch_version;
    };
    if (n.torch_version.empty() && n.script_imports_torch) {
      const std::string python = n.python_exec.empty() ? "python3" : n.python_exec;
      return Make(Name(), n, Verdict::kFail,
                  absl::StrCat(n.script_path, " imports torch, but ", python, " cannot import it"),
                  absl::StrCat("set PYTHON_EXEC to an interpreter that has PyTorch (Debian's: "
                               "PYTHON_EXEC=/usr/bin/python3), or install torch for ",
                               python));
    }
    if (n.torch_version == ref.torch_version || !ref.python_error.empty()) {
      return Make(Name(), n, n.torch_version.empty() ? Verdict::kNotApplicable : Verdict::kPass,
                  text(n));
    }
    return Make(Name(), n, Verdict::kFail,
                absl::StrCat(text(n), ", but ", NodeName(ref), " has ", text(ref)),
                absl::StrCat("install the same PyTorch on every node (", text(ref),
                             "), e.g. one container image or environment"));
  }
};

// ---------------------------------------------------------------------------

class LocalCheck : public Check {
 public:
  CheckResult Run(const NodeFacts& n, const std::vector<NodeFacts>& all,
                  const JobFacts& job) const override {
    if (!n.reported) return Make(Name(), n, Verdict::kNotApplicable, "no facts");
    return Judge(n, all, job);
  }

 protected:
  virtual CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>& all,
                            const JobFacts& job) const = 0;
};

std::string InterfaceNames(const NodeFacts& n) {
  std::vector<std::string> names;
  for (const Interface& i : n.interfaces) {
    if (i.up && i.has_address) names.push_back(i.name);
  }
  return names.empty() ? std::string("none") : absl::StrJoin(names, ",");
}

class NcclSocketIfnameCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "nccl_socket_ifname"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    const std::string* value = EnvOf(n, "NCCL_SOCKET_IFNAME");
    if (value == nullptr || value->empty()) {
      return Make(Name(), n, Verdict::kNotApplicable,
                  "unset (NCCL picks an interface, not lo or docker*)");
    }
    std::vector<std::string> selected;
    for (const Interface& i : n.interfaces) {
      if (i.up && i.has_address && NcclListSelects(*value, i.name)) selected.push_back(i.name);
    }
    const std::string fix = absl::StrCat("set NCCL_SOCKET_IFNAME to interfaces of this node (",
                                         InterfaceNames(n), "), or unset it");
    if (selected.empty()) {
      return Make(Name(), n, Verdict::kFail,
                  absl::StrCat("NCCL_SOCKET_IFNAME=", *value,
                               " selects no interface that is up with an address"),
                  fix);
    }
    // Without "^", an entry that matches nothing is probably a typo.
    if (!absl::StartsWith(*value, "^")) {
      const bool exact = absl::StartsWith(*value, "=");
      const absl::string_view list = absl::string_view(*value).substr(exact ? 1 : 0);
      for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipEmpty())) {
        const std::string one = absl::StrCat(exact ? "=" : "", entry);
        const bool any =
            std::any_of(n.interfaces.begin(), n.interfaces.end(),
                        [&](const Interface& i) { return NcclListSelects(one, i.name); });
        if (!any) {
          return Make(
              Name(), n, Verdict::kWarn,
              absl::StrCat("NCCL_SOCKET_IFNAME=", *value, ": '", entry,
                           "' matches no interface; NCCL uses ", absl::StrJoin(selected, ",")),
              fix);
        }
      }
    }
    return Make(Name(), n, Verdict::kPass,
                absl::StrCat("NCCL_SOCKET_IFNAME=", *value, " -> ", absl::StrJoin(selected, ",")));
  }
};

class GlooSocketIfnameCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "gloo_socket_ifname"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    const std::string* value = EnvOf(n, "GLOO_SOCKET_IFNAME");
    if (value == nullptr || value->empty()) {
      return Make(Name(), n, Verdict::kNotApplicable, "unset (Gloo uses the host name's address)");
    }
    // torch reads a comma-separated list of exact names.
    for (absl::string_view entry : absl::StrSplit(*value, ',')) {
      const auto it = std::find_if(n.interfaces.begin(), n.interfaces.end(),
                                   [&](const Interface& i) { return i.name == entry; });
      if (it == n.interfaces.end() || !it->up || !it->has_address) {
        return Make(
            Name(), n, Verdict::kFail,
            absl::StrCat("GLOO_SOCKET_IFNAME=", *value, ": '", entry, "' ",
                         it == n.interfaces.end() ? "does not exist" : "is down or has no address"),
            absl::StrCat("set GLOO_SOCKET_IFNAME to exact interface names of this node (",
                         InterfaceNames(n), "), or unset it"));
      }
    }
    return Make(Name(), n, Verdict::kPass, absl::StrCat("GLOO_SOCKET_IFNAME=", *value));
  }
};

class NcclIbHcaCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "nccl_ib_hca"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    const std::string* value = EnvOf(n, "NCCL_IB_HCA");
    const bool none = !n.ib_devices || n.ib_devices->empty();
    const std::string devices = none ? "none" : absl::StrJoin(*n.ib_devices, ",");
    if (value == nullptr || value->empty()) {
      return Make(Name(), n, Verdict::kNotApplicable,
                  absl::StrCat("unset; InfiniBand devices: ", devices));
    }
    if (none) {
      return Make(Name(), n, Verdict::kWarn,
                  absl::StrCat("NCCL_IB_HCA=", *value,
                               " but this node has no InfiniBand device (/sys/class/infiniband); "
                               "NCCL falls back to sockets"),
                  "unset NCCL_IB_HCA on nodes without InfiniBand, or load the RDMA drivers");
    }
    std::vector<std::string> selected;
    for (const std::string& d : *n.ib_devices) {
      if (NcclListSelects(*value, d)) selected.push_back(d);
    }
    if (selected.empty()) {
      return Make(
          Name(), n, Verdict::kFail,
          absl::StrCat("NCCL_IB_HCA=", *value, " selects none of ", devices),
          absl::StrCat("set NCCL_IB_HCA to devices of this node (", devices, "), or unset it"));
    }
    return Make(Name(), n, Verdict::kPass,
                absl::StrCat("NCCL_IB_HCA=", *value, " -> ", absl::StrJoin(selected, ",")));
  }
};

class GpuCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "gpus"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts& job) const override {
    const int nproc = job.nproc_per_node;
    if (n.gpu_count == 0) {
      if (n.cpu_count > 0 && nproc > n.cpu_count) {
        return Make(Name(), n, Verdict::kWarn,
                    absl::StrCat("no GPU: ", nproc, " CPU workers on ", n.cpu_count,
                                 " CPUs (oversubscribed)"),
                    absl::StrCat("--nproc_per_node=", n.cpu_count, " (or cpu)"));
      }
      return Make(Name(), n, Verdict::kPass,
                  absl::StrCat("no GPU: ", nproc, " CPU worker", nproc == 1 ? "" : "s", " on ",
                               n.cpu_count, " CPUs"));
    }
    const std::string* cvd = EnvOf(n, "CUDA_VISIBLE_DEVICES");
    std::string invalid;
    const int visible = cvd == nullptr ? n.gpu_count : VisibleGpus(*cvd, n.gpu_count, &invalid);
    const std::string seen = absl::StrCat(
        n.gpu_count, " GPUs (", n.gpu_source, ")",
        cvd == nullptr ? "" : absl::StrCat(", CUDA_VISIBLE_DEVICES=", *cvd, " shows ", visible));
    if (nproc > visible) {
      return Make(
          Name(), n, Verdict::kFail, absl::StrCat(nproc, " workers per node but ", seen),
          absl::StrCat("--nproc_per_node=", visible, " (or gpu)",
                       cvd == nullptr ? "" : ", or list more GPUs in CUDA_VISIBLE_DEVICES"));
    }
    if (!invalid.empty()) {
      return Make(Name(), n, Verdict::kWarn, absl::StrCat(seen, "; CUDA stops at '", invalid, "'"),
                  absl::StrCat("list only GPUs 0-", n.gpu_count - 1,
                               " in CUDA_VISIBLE_DEVICES, without repeats"));
    }
    return Make(Name(), n, Verdict::kPass, absl::StrCat(nproc, " workers on ", seen));
  }
};

class ShmCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "dev_shm"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts& job) const override {
    const std::int64_t sdk = kShmPerRankBytes * job.nproc_per_node + kShmBaseBytes;
    const std::string fix =
        absl::StrCat("give /dev/shm at least ", Bytes(std::max(sdk, kShmDataLoaderBytes)),
                     " (docker run --shm-size=", Bytes(std::max(sdk, kShmDataLoaderBytes) * 2),
                     "; Kubernetes: an emptyDir with medium Memory on /dev/shm)");
    if (n.shm_total < 0) {
      return Make(Name(), n, Verdict::kFail, "/dev/shm is missing", fix);
    }
    const std::string found = absl::StrCat(Bytes(n.shm_free), " free of ", Bytes(n.shm_total));
    if (n.shm_free < sdk) {
      return Make(Name(), n, Verdict::kFail,
                  absl::StrCat(found, "; ", job.nproc_per_node, " workers need ", Bytes(sdk)), fix);
    }
    if (n.shm_free < kShmDataLoaderBytes) {
      return Make(Name(), n, Verdict::kWarn,
                  absl::StrCat(found, "; DataLoader workers want ", Bytes(kShmDataLoaderBytes)),
                  fix);
    }
    return Make(Name(), n, Verdict::kPass, found);
  }
};

class NofileCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "ulimit_nofile"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts& job) const override {
    const std::int64_t soft = n.nofile_soft;
    const std::string found =
        absl::StrCat("ulimit -n ", soft < 0 ? "unlimited" : absl::StrCat(soft));
    if (soft < 0) return Make(Name(), n, Verdict::kPass, found);
    // Node 0 hosts the job's store: every worker of the job connects to it.
    const std::int64_t need = n.group_rank == 0
                                  ? kNofilePerWorker * job.WorldSize() + kNofileBase
                                  : kNofilePerWorker * job.nproc_per_node + kNofileBase;
    const std::string fix =
        absl::StrCat("raise the open-file limit to at least ", std::max(need, kNofileComfortable),
                     " (ulimit -n, limits.conf nofile, docker --ulimit "
                     "nofile=65536:65536); ddprun raises soft to hard");
    if (soft < need) {
      return Make(
          Name(), n, Verdict::kFail,
          absl::StrCat(found, "; ",
                       n.group_rank == 0 ? absl::StrCat("the store of ", Workers(job.WorldSize()))
                                         : Workers(job.nproc_per_node),
                       " needs ", need),
          fix);
    }
    if (soft < kNofileComfortable) {
      return Make(
          Name(), n, Verdict::kWarn,
          absl::StrCat(found, " (DataLoader workers and NCCL want ", kNofileComfortable, ")"), fix);
    }
    return Make(Name(), n, Verdict::kPass, found);
  }
};

class MemlockCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "ulimit_memlock"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    const std::string found = absl::StrCat(
        "ulimit -l ", n.memlock_soft < 0 ? std::string("unlimited") : Bytes(n.memlock_soft));
    const std::string* disable = EnvOf(n, "NCCL_IB_DISABLE");
    const bool ib = n.ib_devices && !n.ib_devices->empty() && !(disable && *disable == "1");
    if (!ib) {
      return Make(Name(), n, Verdict::kNotApplicable,
                  absl::StrCat(found, "; InfiniBand not in use"));
    }
    if (n.memlock_soft >= 0) {
      return Make(Name(), n, Verdict::kWarn,
                  absl::StrCat(found, " with InfiniBand in use: NCCL cannot register its buffers"),
                  "ulimit -l unlimited (limits.conf memlock unlimited, docker --ulimit "
                  "memlock=-1:-1)");
    }
    return Make(Name(), n, Verdict::kPass, found);
  }
};

class ResolveCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "resolve"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    std::vector<std::string> names;
    for (const Resolved& r : n.resolved) {
      if (!r.ok) {
        return Make(Name(), n, Verdict::kFail,
                    absl::StrCat("'", r.name, "' does not resolve: ", r.error),
                    absl::StrCat("add ", r.name,
                                 " to DNS or /etc/hosts on this node, or give an IP address "
                                 "(--local_addr, --rdzv_endpoint)"));
      }
      names.push_back(r.name);
    }
    return Make(Name(), n, names.empty() ? Verdict::kNotApplicable : Verdict::kPass,
                names.empty() ? std::string("no names") : absl::StrJoin(names, " "));
  }
};

class ReachCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "reach"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    std::vector<std::string> bad;
    double worst = 0;
    for (const Reach& r : n.reach) {
      if (!r.ok) {
        bad.push_back(absl::StrCat(r.what, " ", r.address, ": ", r.error));
      } else {
        worst = std::max(worst, r.ms);
      }
    }
    if (!bad.empty()) {
      return Make(Name(), n, Verdict::kFail,
                  absl::StrCat("cannot connect to ", absl::StrJoin(bad, "; ")),
                  "open these TCP ports between the nodes (firewall, security group), or make "
                  "each node advertise a reachable address with --local_addr");
    }
    if (n.reach.empty()) return Make(Name(), n, Verdict::kNotApplicable, "nothing to reach");
    std::vector<std::string> what;
    for (const Reach& r : n.reach) what.push_back(absl::StrCat(r.what, " ", r.address));
    return Make(Name(), n, Verdict::kPass,
                absl::StrCat(absl::StrJoin(what, ", "), absl::StrFormat(" (<= %.1f ms)", worst)));
  }
};

class ClockCheck final : public LocalCheck {
 public:
  std::string_view Name() const override { return "clock"; }
  CheckResult Judge(const NodeFacts& n, const std::vector<NodeFacts>&,
                    const JobFacts&) const override {
    if (!n.clock_measured) {
      return Make(Name(), n, Verdict::kNotApplicable,
                  n.group_rank == 0 ? "the reference" : "not measured");
    }
    // No "-0.0": an offset that rounds to zero is shown as +0.0.
    const double shown = std::abs(n.clock_offset_ms) < 0.05 ? 0.0 : n.clock_offset_ms;
    const std::string found =
        absl::StrFormat("offset to node 0 %+.1f ms (+/- %.1f ms)", shown, n.clock_uncertainty_ms);
    const double excess = std::abs(n.clock_offset_ms) - n.clock_uncertainty_ms;
    const std::string fix =
        "synchronise the clocks with NTP on every node (chronyc tracking; timedatectl set-ntp "
        "true)";
    if (excess > kClockFailMs) return Make(Name(), n, Verdict::kFail, found, fix);
    if (excess > kClockWarnMs) return Make(Name(), n, Verdict::kWarn, found, fix);
    return Make(Name(), n, Verdict::kPass, found);
  }
};

}  // namespace

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kNotApplicable:
      return "n/a";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
  }
  return "?";
}

bool NcclListSelects(absl::string_view list, absl::string_view name) {
  bool exclude = false;
  bool exact = false;
  if (absl::StartsWith(list, "^")) {
    exclude = true;
    list.remove_prefix(1);
  }
  if (absl::StartsWith(list, "=")) {
    exact = true;
    list.remove_prefix(1);
  }
  bool matched = false;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    // "mlx5_0:1" names a port of a device; the port is not part of the name.
    entry = entry.substr(0, entry.find(':'));
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    if (exact ? name == entry : absl::StartsWith(name, entry)) {
      matched = true;
      break;
    }
  }
  return exclude ? !matched : matched;
}

int VisibleGpus(absl::string_view cuda_visible_devices, int physical, std::string* invalid) {
  std::set<std::string> seen;
  int visible = 0;
  for (absl::string_view raw : absl::StrSplit(cuda_visible_devices, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    if (absl::StartsWith(entry, "GPU-") || absl::StartsWith(entry, "MIG-")) {
      if (!seen.insert(entry).second) {
        if (invalid) *invalid = entry;
        break;
      }
      ++visible;
      continue;
    }
    int index = -1;
    if (!absl::SimpleAtoi(entry, &index) || index < 0 || index >= physical ||
        !seen.insert(std::to_string(index)).second) {
      // "" and "-1" hide every GPU on purpose: not a mistake to report.
      if (invalid && !(entry.empty() || entry == "-1")) *invalid = entry;
      break;
    }
    ++visible;
  }
  return visible;
}

std::vector<std::unique_ptr<Check>> DefaultChecks() {
  std::vector<std::unique_ptr<Check>> checks;
  checks.push_back(std::make_unique<ReportedCheck>());
  checks.push_back(std::make_unique<DdprunVersionCheck>());
  checks.push_back(std::make_unique<ScriptCheck>());
  checks.push_back(std::make_unique<PythonCheck>());
  checks.push_back(std::make_unique<TorchCheck>());
  checks.push_back(std::make_unique<NcclSocketIfnameCheck>());
  checks.push_back(std::make_unique<GlooSocketIfnameCheck>());
  checks.push_back(std::make_unique<NcclIbHcaCheck>());
  checks.push_back(std::make_unique<GpuCheck>());
  checks.push_back(std::make_unique<ShmCheck>());
  checks.push_back(std::make_unique<NofileCheck>());
  checks.push_back(std::make_unique<MemlockCheck>());
  checks.push_back(std::make_unique<ResolveCheck>());
  checks.push_back(std::make_unique<ReachCheck>());
  checks.push_back(std::make_unique<ClockCheck>());
  return checks;
}

}  // namespace ddprun::launcher::preflight
