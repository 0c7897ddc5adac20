// --cpu_bind: which CPUs each local worker may run on (docs/cli.md).
//
// Policies (the one list of names; the launcher's parser uses it):
//   none  workers inherit ddprun's affinity (torchrun's behaviour);
//   core  the cores ddprun may use are split into nproc_per_node equal,
//         contiguous blocks; local rank i is bound to block i (every logical
//         CPU of those cores). With as many workers as cores this is mpirun's
//         --bind-to core; more workers than cores is an error;
//   numa  local rank i is bound to the CPUs of NUMA node i * nodes / nproc
//         (workers spread evenly over the nodes, in order; several workers may
//         share a node);
//   auto  (default) core when 2 <= nproc_per_node <= cores, else none: ranks
//         that spin on shared memory never share a core, and nothing is bound
//         when they would have to.
// "Cores ddprun may use": the CPUs of ddprun's own affinity mask (taskset,
// cgroups' cpusets), grouped by physical core (SMT siblings together).
// With `spare_core` (the agent runs background checkpoint threads:
// --ckpt_dir, --ckpt_replicas 1) and more such cores than workers, core and
// numa (auto as core) plan over all but the last core, which no worker is
// bound to: the agent's background checkpoint threads run there
// (BackgroundCpus; docs/checkpoint.md, "Background priority").
//
// The plan is a pure function of the policy, the worker count and a
// CpuTopology (tests/unit/agent/cpu_binding_test.cc); ReadCpuTopology reads
// the real one from sched_getaffinity and /sys. The agent applies a plan
// through SpawnSpec::cpus (sched_setaffinity in the child, before exec).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddprun::agent {

enum class CpuBind { kAuto, kNone, kCore, kNuma };

inline constexpr const char* kCpuBindChoices = "auto, none, core or numa";

inline std::optional<CpuBind> CpuBindFromName(absl::string_view name) {
  if (name == "auto") return CpuBind::kAuto;
  if (name == "none") return CpuBind::kNone;
  if (name == "core") return CpuBind::kCore;
  if (name == "numa") return CpuBind::kNuma;
  return std::nullopt;
}

struct CpuTopology {
  // The usable physical cores in CPU order, each as its usable logical CPUs.
  std::vector<std::vector<int>> cores;
  std::vector<int> core_numa;  // the NUMA node of each core (0 without NUMA)
};

// This process's usable CPUs, grouped by core and NUMA node.
CpuTopology ReadCpuTopology();

// The calling thread's affinity (sched_getaffinity), in CPU order.
std::vector<int> ReadAffinity();

// The CPUs of each local rank (nproc entries), or an empty plan: bind
// nothing. An error (one line, naming the flag and the fix) when the policy
// cannot be met: core with more workers than cores.
// `spare_core`: leave the last core to the agent's background checkpoint
// threads when there are more cores than workers (above).
absl::StatusOr<std::vector<std::vector<int>>> PlanCpuBinding(CpuBind policy, int nproc,
                                                             const CpuTopology& topology,
                                                             bool spare_core = false);
// The same, reading the topology only when the policy needs one: never for
// `none` (the default), where reading sysfs would cost 7 system calls or the
// host's probe for nothing.
absl::StatusOr<std::vector<std::vector<int>>> PlanCpuBinding(
    CpuBind policy, int nproc, absl::FunctionRef<CpuTopology()> read_topology,
    bool spare_core = false);

// Where the agent's background checkpoint threads run (background_priority.h)
// while its workers are bound by `plan` (PlanCpuBinding's or --numa_binding's:
// a CPU list per local rank, an empty one for a rank left unbound).
struct BackgroundCpuSet {
  // The CPUs of the agent's affinity that no worker is bound to; empty: no
  // confinement (the agent's whole affinity).
  std::vector<int> cpus;
  // The plan binds the workers to every CPU of the agent's affinity (or
  // leaves one unbound, free to use any): `cpus` is empty, the threads
  // share the workers' CPUs, and the agent says so once.
  bool workers_take_all = false;
};
// `agent_cpus`: the agent's affinity (ReadAffinity). An empty plan (nothing
// bound) confines nothing and is not workers_take_all.
BackgroundCpuSet BackgroundCpus(const std::vector<int>& agent_cpus,
                                const std::vector<std::vector<int>>& plan);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace ddprun::agent
