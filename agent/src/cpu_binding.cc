#include "ddprun/agent/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::agent {
namespace {

// A sysfs integer, or `fallback` when the file is absent or garbled.
int ReadInt(const std::string& path, int fallback) {
  std::ifstream f(path);
  std::string s;
  int v = 0;
  if (!std::getline(f, s) || !absl::SimpleAtoi(absl::StripAsciiWhitespace(s), &v)) return fallback;
  return v;
}

// "0-3,8" -> {0, 1, 2, 3, 8}; garbled parts are skipped.
std::vector<int> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> r = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(r.first), &lo)) continue;
    hi = lo;
    if (!r.second.empty() && !absl::SimpleAtoi(absl::StripAsciiWhitespace(r.second), &hi)) continue;
    for (int c = lo; c <= hi && c - lo < 65536; ++c) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

CpuTopology ReadCpuTopology() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  // NUMA node of each CPU (none: node 0).
  std::map<int, int> numa_of;
  for (int node = 0; node < 1024; ++node) {
    std::ifstream f(absl::StrCat("/sys/devices/system/node/node", node, "/cpulist"));
    if (!f) {
      if (node > 0) break;
      continue;
    }
    std::string line;
    std::getline(f, line);
    for (int c : ParseCpuList(line)) numa_of[c] = node;
  }
  // Cores keyed by (package, core id), in the order of their first CPU.
  std::map<std::pair<int, int>, std::size_t> index;
  CpuTopology t;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
    const std::pair<int, int> key{ReadInt(dir + "physical_package_id", 0),
                                  ReadInt(dir + "core_id", cpu)};
    auto [it, fresh] = index.emplace(key, t.cores.size());
    if (fresh) {
      t.cores.emplace_back();
      t.core_numa.push_back(numa_of.count(cpu) ? numa_of[cpu] : 0);
    }
    t.cores[it->second].push_back(cpu);
  }
  return t;
}

std::vector<int> ReadAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::StatusOr<std::vector<std::vector<int>>> PlanCpuBinding(
    CpuBind policy, int nproc, absl::FunctionRef<CpuTopology()> read_topology, bool spare_core) {
  if (policy == CpuBind::kNone) return std::vector<std::vector<int>>{};
  return PlanCpuBinding(policy, nproc, read_topology(), spare_core);
}

absl::StatusOr<std::vector<std::vector<int>>> PlanCpuBinding(CpuBind policy, int nproc,
                                                             const CpuTopology& whole,
                                                             bool spare_core) {
  int cores = static_cast<int>(whole.cores.size());
  if (nproc <= 0 || cores == 0 || policy == CpuBind::kNone) return std::vector<std::vector<int>>{};
  if (policy == CpuBind::kAuto) {
    if (nproc < 2 || nproc > cores) return std::vector<std::vector<int>>{};
    policy = CpuBind::kCore;
  }
  // The last core stays free for the agent's background checkpoint threads.
  CpuTopology kept;
  const bool spare = spare_core && cores > nproc;
  if (spare) {
    kept = whole;
    kept.cores.pop_back();
    kept.core_numa.pop_back();
    --cores;
  }
  const CpuTopology& topology = spare ? kept : whole;
  std::vector<std::vector<int>> plan(static_cast<std::size_t>(nproc));
  if (policy == CpuBind::kCore) {
    if (nproc > cores) {
      std::vector<int> all;
      for (const auto& c : topology.cores) all.insert(all.end(), c.begin(), c.end());
      std::sort(all.begin(), all.end());
      return absl::InvalidArgumentError(absl::StrCat(
          nproc, " workers but ddprun may use only ", cores, " core(s) (CPUs ", FormatCpuList(all),
          ") and core gives each worker its own; use --cpu_bind=none (or ", "auto), or at most ",
          cores, " worker(s) per node"));
    }
    for (int i = 0; i < nproc; ++i) {
      for (int c = i * cores / nproc; c < (i + 1) * cores / nproc; ++c) {
        const auto& cpus = topology.cores[static_cast<std::size_t>(c)];
        plan[i].insert(plan[i].end(), cpus.begin(), cpus.end());
      }
      std::sort(plan[i].begin(), plan[i].end());
    }
    return plan;
  }
  // kNuma: the nodes that have usable cores, in order.
  std::vector<int> nodes = topology.core_numa;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  const int n = static_cast<int>(nodes.size());
  for (int i = 0; i < nproc; ++i) {
    const int node = nodes[static_cast<std::size_t>(i * n / nproc)];
    for (int c = 0; c < cores; ++c) {
      if (topology.core_numa[static_cast<std::size_t>(c)] != node) continue;
      const auto& cpus = topology.cores[static_cast<std::size_t>(c)];
      plan[i].insert(plan[i].end(), cpus.begin(), cpus.end());
    }
    std::sort(plan[i].begin(), plan[i].end());
  }
  return plan;
}

BackgroundCpuSet BackgroundCpus(const std::vector<int>& agent_cpus,
                                const std::vector<std::vector<int>>& plan) {
  BackgroundCpuSet out;
  if (plan.empty()) return out;
  std::set<int> bound;
  for (const std::vector<int>& cpus : plan) {
    if (cpus.empty()) {  // an unbound worker may run on any CPU
      out.workers_take_all = true;
      return out;
    }
    bound.insert(cpus.begin(), cpus.end());
  }
  for (int c : agent_cpus) {
    if (bound.count(c) == 0) out.cpus.push_back(c);
  }
  std::sort(out.cpus.begin(), out.cpus.end());
  out.cpus.erase(std::unique(out.cpus.begin(), out.cpus.end()), out.cpus.end());
  out.workers_take_all = out.cpus.empty();
  return out;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? absl::StrCat(cpus[i], "-", cpus[j]) : absl::StrCat(cpus[i]);
    i = j + 1;
  }
  return out;
}

}  // namespace ddprun::agent
