// --numa_binding (torchrun 2.9+'s --numa-binding): each worker runs on the
// CPUs of the NUMA node its GPU hangs off, read from sysfs without loading
// CUDA. Pure planning over a CpuTopology (cpu_binding.h) plus one sysfs
// reader, so unit tests give fake directories.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ddprun/agent/cpu_binding.h"

namespace ddprun::agent {

enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };

inline constexpr const char* kNumaBindingChoices = "node, socket, exclusive or core-complex";

std::optional<NumaBinding> NumaBindingFromName(absl::string_view name);  // nullopt: unknown
const char* NumaBindingName(NumaBinding mode);                           // "node", ...

// The NUMA node of the GPU of each of `nproc` local ranks. Local rank i uses
// visible GPU i: entry i of `visible` (CUDA_VISIBLE_DEVICES) when that is an
// index, else GPU i. GPU k is the k-th PCI bus id of proc_gpus_dir (the
// driver's list, sorted as nvidia-smi numbers them); its node is
// pci_dir/<bus id>/numa_node. -1 where unknown (a UUID entry, no such GPU, a
// machine without NUMA). Empty when there is no NVIDIA GPU at all.
std::vector<int> GpuNumaNodes(int nproc, const std::string& visible,
                              const std::string& proc_gpus_dir = "/proc/driver/nvidia/gpus",
                              const std::string& pci_dir = "/sys/bus/pci/devices");

// The CPUs of each local rank (gpu_nodes.size() entries): node, socket and
// core-complex give every usable CPU of the GPU's NUMA node (ddprun treats a
// socket and an L3 complex as that node: the finer split of torchrun's
// core-complex is not made); exclusive splits that node's cores into equal
// contiguous blocks among the ranks whose GPUs share it. A rank whose node is
// unknown or has no usable core gets an empty list (it is not bound).
std::vector<std::vector<int>> PlanGpuNumaBinding(NumaBinding mode,
                                                 const std::vector<int>& gpu_nodes,
                                                 const CpuTopology& topology);

}  // namespace ddprun::agent
