// A group's Gloo full meshes (the async one, its sync-mode twin, the hosts'
// leaders' ones) formed from one exchange through the store.
//
// Gloo's own connectFullMesh costs each mesh a store write, a read per lower
// rank and a wait and a read per peer, then connects its pairs one after the
// other, each connect waiting for the peer to reach the same pair. Here every
// rank creates the pairs of all its meshes first and publishes one record
// under key + "<rank>" (its transport address once and the listening port of
// each pair, so a record grows by a few bytes per peer); one MultiGet reads
// every rank's. Then each rank first connects the pairs on which Gloo makes it
// the connecting side, which needs nothing from the peer but its listening
// socket (open since before the record was written), and only then waits for
// the pairs its peers connect: no rank waits on a rank that waits in turn.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddp/process_group.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"

namespace ddprun::rendezvous {
class Store;
}

namespace ddp::detail {

// One mesh: its members (job ranks, in the mesh's rank order; the same list
// on every rank) and whether its pairs are in sync mode (the calling thread
// reads and writes their sockets itself; gloo_backend.cc).
struct MeshSpec {
  std::vector<int> members;
  bool sync = false;
};

struct Meshes {
  // One per spec, in order: null where this rank is not a member; a mesh of
  // one member has no pairs.
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  // Every other rank's pair addresses, as Gloo names a peer in its errors
  // ("[127.0.0.1]:41235") -> that job rank.
  std::map<std::string, int> rank_of_address;
};

// Connects this rank's meshes over `device` (Gloo's TCP transport). Every
// rank of the job calls it with the same specs and key; `timeout` bounds the
// exchange and each pair's connect. Errors are Unavailable (a pair could not
// connect, with Gloo's message) or the store's, with what failed; not fenced.
absl::StatusOr<Meshes> ConnectMeshes(const WorkerInfo& info, const std::vector<MeshSpec>& specs,
                                     const std::shared_ptr<gloo::transport::Device>& device,
                                     ddprun::rendezvous::Store& store, const std::string& key,
                                     Duration timeout);

// What Gloo's TCP Pair::connect decides from the two listening addresses
// (its rule, restated): true when `self` connects to `peer`, false when it
// waits for `peer` to connect. Exposed for its unit test.
bool ConnectsToPeer(const std::vector<char>& self, const std::vector<char>& peer);

}  // namespace ddp::detail
