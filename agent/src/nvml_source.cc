// GpuSource over NVML (metrics_collector.h), loaded at run time with dlopen:
// ddprun needs no CUDA to build or run, and a machine without the driver
// reports n/a. Only stable NVML entry points are used; the per-process
// list tries the v3, v2 and v1 layouts in turn.
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ddprun/agent/metrics_collector.h"

namespace ddprun::agent {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;

struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlProcessV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct NvmlProcessV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
struct NvmlProcessV3 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
  unsigned long long used_gpu_cc_protected_memory;
};
// NVML reports this for memory it cannot attribute (no permission).
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;

class NvmlSource final : public GpuSource {
 public:
  ~NvmlSource() override {
    if (shutdown_ != nullptr && initialized_) shutdown_();
    if (lib_ != nullptr) ::dlclose(lib_);
  }

  GpuUse Sample(const std::set<pid_t>& pids) override {
    std::call_once(once_, [this] { Load(); });
    GpuUse use;
    if (!initialized_) return use;
    unsigned int count = 0;
    if (get_count_(&count) != kNvmlSuccess) return use;
    for (unsigned int i = 0; i < count; ++i) {
      nvmlDevice_t dev = nullptr;
      if (get_handle_(i, &dev) != kNvmlSuccess) continue;
      bool ours = false;
      std::uint64_t mem = 0;
      for (const auto& [pid, bytes] : Processes(dev)) {
        if (pids.count(static_cast<pid_t>(pid)) == 0) continue;
        ours = true;
        if (bytes != kNvmlValueNotAvailable) mem += bytes;
      }
      if (!ours) continue;
      NvmlUtilization u{};
      const double util = get_util_(dev, &u) == kNvmlSuccess ? u.gpu : 0.0;
      use.util_percent = std::max(use.util_percent, util);
      use.mem_bytes += mem;
    }
    return use;
  }

 private:
  template <class T>
  T Sym(const char* name) {
    return reinterpret_cast<T>(::dlsym(lib_, name));
  }

  void Load() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    auto init = Sym<nvmlReturn_t (*)()>("nvmlInit_v2");
    shutdown_ = Sym<nvmlReturn_t (*)()>("nvmlShutdown");
    get_count_ = Sym<nvmlReturn_t (*)(unsigned int*)>("nvmlDeviceGetCount_v2");
    get_handle_ =
        Sym<nvmlReturn_t (*)(unsigned int, nvmlDevice_t*)>("nvmlDeviceGetHandleByIndex_v2");
    get_util_ =
        Sym<nvmlReturn_t (*)(nvmlDevice_t, NvmlUtilization*)>("nvmlDeviceGetUtilizationRates");
    procs_v3_ = Sym<ProcsFn>("nvmlDeviceGetComputeRunningProcesses_v3");
    procs_v2_ = Sym<ProcsFn>("nvmlDeviceGetComputeRunningProcesses_v2");
    procs_v1_ = Sym<ProcsFn>("nvmlDeviceGetComputeRunningProcesses");
    if (init == nullptr || get_count_ == nullptr || get_handle_ == nullptr ||
        get_util_ == nullptr ||
        (procs_v3_ == nullptr && procs_v2_ == nullptr && procs_v1_ == nullptr)) {
      return;
    }
    initialized_ = init() == kNvmlSuccess;
  }

  using ProcsFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, void*);

  template <class Info>
  bool List(ProcsFn fn, nvmlDevice_t dev,
            std::vector<std::pair<unsigned, unsigned long long>>* out) {
    if (fn == nullptr) return false;
    std::vector<Info> infos(64);
    for (int attempt = 0; attempt < 3; ++attempt) {
      unsigned int n = static_cast<unsigned int>(infos.size());
      const nvmlReturn_t r = fn(dev, &n, infos.data());
      if (r == kNvmlSuccess) {
        for (unsigned int i = 0; i < n && i < infos.size(); ++i) {
          out->emplace_back(infos[i].pid, infos[i].used_gpu_memory);
        }
        return true;
      }
      if (r != kNvmlInsufficientSize) return false;
      infos.resize(std::max<std::size_t>(n + 16, infos.size() * 2));
    }
    return false;
  }

  std::vector<std::pair<unsigned, unsigned long long>> Processes(nvmlDevice_t dev) {
    std::vector<std::pair<unsigned, unsigned long long>> out;
    if (List<NvmlProcessV3>(procs_v3_, dev, &out)) return out;
    out.clear();
    if (List<NvmlProcessV2>(procs_v2_, dev, &out)) return out;
    out.clear();
    List<NvmlProcessV1>(procs_v1_, dev, &out);
    return out;
  }

  std::once_flag once_;
  void* lib_ = nullptr;
  bool initialized_ = false;
  nvmlReturn_t (*shutdown_)() = nullptr;
  nvmlReturn_t (*get_count_)(unsigned int*) = nullptr;
  nvmlReturn_t (*get_handle_)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_util_)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  ProcsFn procs_v3_ = nullptr, procs_v2_ = nullptr, procs_v1_ = nullptr;
};

}  // namespace

std::unique_ptr<GpuSource> MakeNvmlSource() { return std::make_unique<NvmlSource>(); }

}  // namespace ddprun::agent
