// --cpu_bind's plan as a pure function of the policy, the worker count and a
// topology (cpu_binding.h); the real affinity is checked in
// tests/multiproc/cpu_bind_test.cc.
#include "ddprun/agent/cpu_binding.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "ddprun/agent/gpu_numa.h"

namespace ddprun::agent {
namespace {

using Plan = std::vector<std::vector<int>>;

// `cores` cores of `smt` threads each, numbered like Intel's sysfs (core c's
// siblings are c, c + cores, ...), split evenly over `nodes` NUMA nodes.
CpuTopology Topo(int cores, int smt = 1, int nodes = 1) {
  CpuTopology t;
  for (int c = 0; c < cores; ++c) {
    std::vector<int> cpus;
    for (int s = 0; s < smt; ++s) cpus.push_back(c + s * cores);
    t.cores.push_back(cpus);
    t.core_numa.push_back(c * nodes / cores);
  }
  return t;
}

}  // namespace

TEST_CASE("cpu_bind names: the four policies, nothing else", "[unit]") {
  CHECK(CpuBindFromName("auto") == CpuBind::kAuto);
  CHECK(CpuBindFromName("none") == CpuBind::kNone);
  CHECK(CpuBindFromName("core") == CpuBind::kCore);
  CHECK(CpuBindFromName("numa") == CpuBind::kNuma);
  CHECK_FALSE(CpuBindFromName("Core").has_value());
  CHECK_FALSE(CpuBindFromName("socket").has_value());
  CHECK_FALSE(CpuBindFromName("").has_value());
}

TEST_CASE("the topology is read only for a policy that binds", "[unit]") {
  int reads = 0;
  auto read = [&] {
    ++reads;
    return Topo(4);
  };
  CHECK(PlanCpuBinding(CpuBind::kNone, 8, read)->empty());
  CHECK(reads == 0);
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, read) == Plan{{0, 1}, {2, 3}});
  CHECK(reads == 1);
  CHECK_FALSE(PlanCpuBinding(CpuBind::kCore, 5, read).ok());  // 5 workers, 4 cores
  CHECK(reads == 2);
}

TEST_CASE("cpu_bind=core: one core each, or equal blocks of cores", "[unit]") {
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(2)) == Plan{{0}, {1}});
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(8)) == Plan{{0, 1, 2, 3}, {4, 5, 6, 7}});
  // Uneven: blocks differ by at most one core and cover every core.
  CHECK(*PlanCpuBinding(CpuBind::kCore, 3, Topo(4)) == Plan{{0}, {1}, {2, 3}});
  // SMT siblings stay with their core: worker 0 never gets worker 1's core.
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(4, 2)) == Plan{{0, 1, 4, 5}, {2, 3, 6, 7}});
  // One worker: all of it.
  CHECK(*PlanCpuBinding(CpuBind::kCore, 1, Topo(2)) == Plan{{0, 1}});
}

TEST_CASE("cpu_bind=core with more workers than cores: one line naming both and the fix",
          "[unit]") {
  auto plan = PlanCpuBinding(CpuBind::kCore, 3, Topo(2));
  REQUIRE_FALSE(plan.ok());
  const std::string m(plan.status().message());
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.find("3 workers") != std::string::npos);
  CHECK(m.find("2 core(s) (CPUs 0-1)") != std::string::npos);
  CHECK(m.find("--cpu_bind=none") != std::string::npos);
}

TEST_CASE("cpu_bind=auto: core while every worker can have its own core, else nothing", "[unit]") {
  CHECK(*PlanCpuBinding(CpuBind::kAuto, 2, Topo(2)) == Plan{{0}, {1}});
  CHECK(*PlanCpuBinding(CpuBind::kAuto, 2, Topo(16)) ==
        *PlanCpuBinding(CpuBind::kCore, 2, Topo(16)));
  CHECK(PlanCpuBinding(CpuBind::kAuto, 3, Topo(2))->empty());  // oversubscribed: never an error
  CHECK(PlanCpuBinding(CpuBind::kAuto, 1, Topo(2))->empty());  // one worker keeps everything
}

TEST_CASE("cpu_bind=none binds nothing; an unknown topology binds nothing", "[unit]") {
  CHECK(PlanCpuBinding(CpuBind::kNone, 2, Topo(2))->empty());
  CHECK(PlanCpuBinding(CpuBind::kCore, 2, CpuTopology{})->empty());
}

TEST_CASE("cpu_bind=numa: workers spread over the nodes in order", "[unit]") {
  // 2 nodes of 4 cores (0-3, 4-7).
  CHECK(*PlanCpuBinding(CpuBind::kNuma, 2, Topo(8, 1, 2)) == Plan{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(*PlanCpuBinding(CpuBind::kNuma, 4, Topo(8, 1, 2)) ==
        Plan{{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {4, 5, 6, 7}});
  // More workers than cores is fine: they share their node.
  CHECK(PlanCpuBinding(CpuBind::kNuma, 16, Topo(8, 1, 2))->size() == 16);
  // One node: every worker gets every CPU.
  CHECK(*PlanCpuBinding(CpuBind::kNuma, 2, Topo(2)) == Plan{{0, 1}, {0, 1}});
}

TEST_CASE("spare core: with background checkpoint threads the last core is left unbound",
          "[unit]") {
  // More cores than workers: the workers share all but the last core.
  CHECK(*PlanCpuBinding(CpuBind::kCore, 1, Topo(2), true) == Plan{{0}});
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(8), true) == Plan{{0, 1, 2}, {3, 4, 5, 6}});
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(4, 2), true) == Plan{{0, 4}, {1, 2, 5, 6}});
  CHECK(*PlanCpuBinding(CpuBind::kAuto, 2, Topo(3), true) == Plan{{0}, {1}});
  CHECK(*PlanCpuBinding(CpuBind::kNuma, 2, Topo(8, 1, 2), true) == Plan{{0, 1, 2, 3}, {4, 5, 6}});
  // As many workers as cores: each keeps its own core, none is spared.
  CHECK(*PlanCpuBinding(CpuBind::kCore, 2, Topo(2), true) == Plan{{0}, {1}});
  CHECK(*PlanCpuBinding(CpuBind::kAuto, 2, Topo(2), true) == Plan{{0}, {1}});
  // auto with one worker, and none, still bind nothing.
  CHECK(PlanCpuBinding(CpuBind::kAuto, 1, Topo(2), true)->empty());
  CHECK(PlanCpuBinding(CpuBind::kNone, 1, Topo(2), true)->empty());
}

TEST_CASE("BackgroundCpus: the agent's CPUs no worker is bound to; none left: the whole set",
          "[unit]") {
  // One worker on CPU 0 of 0-1: the threads on 1.
  BackgroundCpuSet s = BackgroundCpus({0, 1}, Plan{{0}});
  CHECK(s.cpus == std::vector<int>{1});
  CHECK_FALSE(s.workers_take_all);
  s = BackgroundCpus({0, 1, 2, 3, 4, 5, 6, 7}, Plan{{0, 4}, {1, 2, 5, 6}});
  CHECK(s.cpus == std::vector<int>{3, 7});
  // A CPU the agent may not use is never handed out.
  CHECK(BackgroundCpus({0, 1, 2}, Plan{{0}, {1}}).cpus == std::vector<int>{2});
  // Every CPU bound: no confinement (the whole set), said by the agent.
  s = BackgroundCpus({0, 1}, Plan{{0}, {1}});
  CHECK(s.cpus.empty());
  CHECK(s.workers_take_all);
  // A worker left unbound (--numa_binding without its GPU's node) may run
  // anywhere: the same.
  s = BackgroundCpus({0, 1, 2, 3}, Plan{{0}, {}});
  CHECK(s.cpus.empty());
  CHECK(s.workers_take_all);
  // Nothing bound: nothing confined, nothing to say.
  s = BackgroundCpus({0, 1}, Plan{});
  CHECK(s.cpus.empty());
  CHECK_FALSE(s.workers_take_all);
}

TEST_CASE("CPU lists are written as ranges", "[unit]") {
  CHECK(FormatCpuList({0, 1, 2, 3, 8}) == "0-3,8");
  CHECK(FormatCpuList({1}) == "1");
  CHECK(FormatCpuList({}).empty());
  CHECK(FormatCpuList({0, 2, 4, 5}) == "0,2,4-5");
}

TEST_CASE("this machine's topology: every usable CPU once", "[unit]") {
  const CpuTopology t = ReadCpuTopology();
  REQUIRE_FALSE(t.cores.empty());
  CHECK(t.core_numa.size() == t.cores.size());
  std::vector<int> all;
  for (const auto& c : t.cores) all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
}

}  // namespace ddprun::agent

// --numa_binding: the GPU's NUMA node from sysfs (fake directories here).
namespace ddprun::agent {
namespace {

TEST_CASE("GpuNumaNodes: each local rank's GPU's NUMA node from sysfs", "[unit]") {
  char tmpl[] = "/tmp/ddprun_gpunuma_XXXXXX";
  const std::filesystem::path root = ::mkdtemp(tmpl);
  const auto proc = root / "proc", pci = root / "pci";
  const std::vector<std::pair<std::string, int>> gpus = {
      {"0000:CA:00.0", 1}, {"0000:17:00.0", 0}, {"0000:3D:00.0", 0}, {"0000:E3:00.0", -1}};
  for (const auto& [bus, node] : gpus) {
    std::filesystem::create_directories(proc / bus);
    std::filesystem::create_directories(pci / absl::AsciiStrToLower(bus));
    std::ofstream(pci / absl::AsciiStrToLower(bus) / "numa_node") << node << "\n";
  }
  // GPU k is the k-th bus id in order: 17 (node 0), 3D (0), CA (1), E3 (unknown).
  CHECK(GpuNumaNodes(4, "", proc.string(), pci.string()) == std::vector<int>{0, 0, 1, -1});
  CHECK(GpuNumaNodes(2, "2,0", proc.string(), pci.string()) == std::vector<int>{1, 0});
  CHECK(GpuNumaNodes(3, "GPU-abc,2", proc.string(), pci.string()) == std::vector<int>{-1, 1, -1});
  CHECK(GpuNumaNodes(2, "", (root / "none").string(), pci.string()).empty());
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

TEST_CASE("PlanGpuNumaBinding: node, exclusive, unknown", "[unit]") {
  CpuTopology t;
  t.cores = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  t.core_numa = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<int> nodes = {0, 0, 1, -1};
  auto node = PlanGpuNumaBinding(NumaBinding::kNode, nodes, t);
  REQUIRE(node.size() == 4);
  CHECK(node[0] == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(node[1] == node[0]);
  CHECK(node[2] == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(node[3].empty());  // unknown node: not bound
  auto excl = PlanGpuNumaBinding(NumaBinding::kExclusive, nodes, t);
  CHECK(excl[0] == std::vector<int>{0, 1, 8, 9});
  CHECK(excl[1] == std::vector<int>{2, 3, 10, 11});
  CHECK(excl[2] == node[2]);  // alone on node 1
  CHECK(PlanGpuNumaBinding(NumaBinding::kSocket, nodes, t) == node);
  CHECK(PlanGpuNumaBinding(NumaBinding::kNone, nodes, t).empty());
  CHECK(NumaBindingFromName("core-complex") == NumaBinding::kCoreComplex);
  CHECK_FALSE(NumaBindingFromName("gpu").has_value());
}

}  // namespace
}  // namespace ddprun::agent
