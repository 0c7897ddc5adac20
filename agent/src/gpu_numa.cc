#include "ddprun/agent/gpu_numa.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace ddprun::agent {

std::optional<NumaBinding> NumaBindingFromName(absl::string_view name) {
  if (name == "node") return NumaBinding::kNode;
  if (name == "socket") return NumaBinding::kSocket;
  if (name == "exclusive") return NumaBinding::kExclusive;
  if (name == "core-complex" || name == "core_complex") return NumaBinding::kCoreComplex;
  return std::nullopt;
}

const char* NumaBindingName(NumaBinding mode) {
  switch (mode) {
    case NumaBinding::kNode:
      return "node";
    case NumaBinding::kSocket:
      return "socket";
    case NumaBinding::kExclusive:
      return "exclusive";
    case NumaBinding::kCoreComplex:
      return "core-complex";
    case NumaBinding::kNone:
      break;
  }
  return "none";
}

std::vector<int> GpuNumaNodes(int nproc, const std::string& visible,
                              const std::string& proc_gpus_dir, const std::string& pci_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> bus_ids;
  std::error_code ec;
  for (fs::directory_iterator it(proc_gpus_dir, ec), end; !ec && it != end; it.increment(ec)) {
    bus_ids.push_back(it->path().filename().string());
  }
  if (bus_ids.empty()) return {};
  std::sort(bus_ids.begin(), bus_ids.end());
  std::vector<std::string> entries;
  if (!visible.empty()) entries = absl::StrSplit(visible, ',');
  std::vector<int> nodes(static_cast<std::size_t>(std::max(0, nproc)), -1);
  for (int i = 0; i < nproc; ++i) {
    int gpu = i;
    if (!entries.empty()) {
      if (i >= static_cast<int>(entries.size())) continue;
      const std::string e(absl::StripAsciiWhitespace(entries[static_cast<std::size_t>(i)]));
      if (e.empty() || !std::isdigit(static_cast<unsigned char>(e[0])) ||
          !absl::SimpleAtoi(e, &gpu)) {
        continue;  // a UUID: which bus id it is needs NVML; left unbound
      }
    }
    if (gpu < 0 || gpu >= static_cast<int>(bus_ids.size())) continue;
    std::ifstream f(fs::path(pci_dir) /
                    absl::AsciiStrToLower(bus_ids[static_cast<std::size_t>(gpu)]) / "numa_node");
    int node = -1;
    if (f >> node) nodes[static_cast<std::size_t>(i)] = node;
  }
  return nodes;
}

std::vector<std::vector<int>> PlanGpuNumaBinding(NumaBinding mode,
                                                 const std::vector<int>& gpu_nodes,
                                                 const CpuTopology& topology) {
  std::vector<std::vector<int>> plan(gpu_nodes.size());
  if (mode == NumaBinding::kNone) return {};
  for (std::size_t i = 0; i < gpu_nodes.size(); ++i) {
    const int node = gpu_nodes[i];
    if (node < 0) continue;
    std::vector<std::size_t> cores;  // the node's usable cores, in order
    for (std::size_t c = 0; c < topology.cores.size(); ++c) {
      if (topology.core_numa[c] == node) cores.push_back(c);
    }
    std::size_t first = 0, last = cores.size();
    if (mode == NumaBinding::kExclusive) {
      // This rank's block among the ranks that share the node, in rank order.
      std::size_t sharing = 0, index = 0;
      for (std::size_t j = 0; j < gpu_nodes.size(); ++j) {
        if (gpu_nodes[j] != node) continue;
        if (j < i) ++index;
        ++sharing;
      }
      first = index * cores.size() / sharing;
      last = (index + 1) * cores.size() / sharing;
    }
    for (std::size_t k = first; k < last; ++k) {
      const auto& cpus = topology.cores[cores[k]];
      plan[i].insert(plan[i].end(), cpus.begin(), cpus.end());
    }
    std::sort(plan[i].begin(), plan[i].end());
  }
  return plan;
}

}  // namespace ddprun::agent
