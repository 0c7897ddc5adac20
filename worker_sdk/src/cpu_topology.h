// Which path a CPU group's collectives take, decided from which ranks share
// a host and from the message size (the numbers behind the choices are in
// the comments of cpu_topology.cc and docs/benchmarks.md). Pure functions:
// tests/unit/worker_sdk/cpu_topology_test.cc.
#pragma once

#include <cstddef>

namespace ddp::detail {

enum class CpuPath {
  kOneHostShm,    // every rank on one host: every collective in shared memory, no Gloo mesh
  kHierarchical,  // several hosts, some with several ranks: all-reduce = the host's sum in
                  // shared memory, the hosts' first ranks over Gloo, a shared memory
                  // broadcast back; the other collectives on a Gloo mesh of all ranks
  kTcp,           // Gloo's TCP transport only
};

// Whether shared memory is worth setting up: some host has more than one
// rank (num_hosts < world_size).
bool WantSharedMemory(bool shared_memory_allowed, int world_size, int num_hosts);

// The path, once the shared memory bootstrap answered (shm_connected: every
// rank mapped its host's segment).
CpuPath ChooseCpuPath(int num_hosts, bool shm_connected);

// The largest all-reduce (bytes) that runs on the sync-mode context (Gloo's
// rings over bound buffers, blocking writes) among `ranks` ranks; larger ones
// use the async context. wmem_max: net.core.wmem_max.
std::size_t SyncAllreduceMaxBytes(std::size_t wmem_max, int ranks);

// net.core.wmem_max, the most SO_SNDBUF a process may ask for (Linux's
// default when it cannot be read).
std::size_t WmemMax();

}  // namespace ddp::detail
