// Building a group from a Store, a rank and a world size: the part of
// ddp::Init that comes after the environment. Init (process_group.cc) reads
// ddprun's variables, opens the GrpcStore and calls ConnectBackend; tests and
// embedders call it directly with any Store, for example W threads of one
// process over one InMemoryStore (tests/support/thread_ranks.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend.h"
#include "ddp/process_group.h"

namespace ddprun::rendezvous {
class Store;
}

namespace ddp::detail {

// The identity of rank `rank` of `world_size` in a group built without
// ddprun's environment: every rank on this host (127.0.0.1), job "local",
// round 0. Its fence is "[job local round 0 rank <r>] ".
WorkerInfo LocalWorkerInfo(int rank, int world_size);

// Bootstraps this rank's backend through `store` under `key_prefix` (the
// group's key space: every rank of the group passes the same prefix, and no
// other group of the same store uses it). Every rank calls it concurrently with
// the same options; it returns once every rank is connected, or fails after
// options.timeout. options.backend kAuto picks NCCL when built with it and a
// CUDA device is visible, Gloo otherwise. Environment variables are not read
// here (DDP_* overrides are applied by Init before).
absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(
    const WorkerInfo& info, const InitOptions& options,
    std::shared_ptr<ddprun::rendezvous::Store> store, const std::string& key_prefix);

}  // namespace ddp::detail
