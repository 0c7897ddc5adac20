#include "cpu_topology.h"

#include <algorithm>
#include <cstdio>

namespace ddp::detail {

bool WantSharedMemory(bool shared_memory_allowed, int world_size, int num_hosts) {
  return shared_memory_allowed && world_size > 1 && num_hosts < world_size;
}

CpuPath ChooseCpuPath(int num_hosts, bool shm_connected) {
  if (!shm_connected) return CpuPath::kTcp;
  return num_hosts == 1 ? CpuPath::kOneHostShm : CpuPath::kHierarchical;
}

// The sync rings are worth it while latency dominates. Their writes block,
// and every rank writes before it reads, so a message must fit in the
// socket's send buffer or the ranks deadlock: Gloo sizes SO_SNDBUF to the
// message, which the kernel caps at net.core.wmem_max (and then doubles).
// Above that, the async context. Measured here (p50 of back to back calls,
// TCP loopback): at 2 ranks the sync ring wins up to 4 MiB; at 3-4 ranks the
// chunked one wins 3-5x up to 256 KiB (0.46-1.1 ms against 1.5-5.4 ms) but
// loses at 1 MiB at 4 ranks (8.0 against 4.9 ms).
std::size_t SyncAllreduceMaxBytes(std::size_t wmem_max, int ranks) {
  const std::size_t cap = ranks == 2 ? std::size_t(4) << 20 : std::size_t(256) << 10;
  return std::min(cap, wmem_max);
}

std::size_t WmemMax() {
  std::size_t v = 212992;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
    unsigned long long x = 0;
    if (std::fscanf(f, "%llu", &x) == 1 && x > 0) v = static_cast<std::size_t>(x);
    std::fclose(f);
  }
  return v;
}

}  // namespace ddp::detail
