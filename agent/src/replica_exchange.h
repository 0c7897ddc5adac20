// --ckpt_replicas' step before a round's workers start (docs/checkpoint.md,
// "Peer replicas"):
//
//  1. Fence: the replica server takes requests of this round only, with the
//     job's store token.
//  2. Publish, in the round's TCPStore (MASTER_ADDR:MASTER_PORT, served by
//     the group rank 0 agent), key kKeyPrefix + "<job id>/<round>/<group
//     rank>" = "<replica host:port>;<seat and step of each held replica>",
//     and read every node's key (a deadline: kExchangeTimeout).
//  3. Restore: when no step is common to this node's local ranks (a spare,
//     an elastic re-join), the replicas of its seat (RANK base .. base +
//     local - 1 of WORLD_SIZE) that the node holding the newest one offered
//     are fetched from it (or taken from this node's own store), newest
//     first, and seeded into the checkpoint memory, as --ckpt_dir's resume
//     does; nothing is read from storage. Each replica stands alone: one
//     that cannot be fetched is one line and is not offered to load(); the
//     others are.
//  4. The successor (group rank + 1 mod nodes) receives this node's
//     snapshots from now on.
// Every other failure is one line and leaves the round without replicas
// (the workers start as they would without them). Main thread.
#ifndef DDPRUN_AGENT_SRC_REPLICA_EXCHANGE_H_
#define DDPRUN_AGENT_SRC_REPLICA_EXCHANGE_H_

#include <chrono>
#include <functional>
#include <string>

#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_replicas.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

inline constexpr const char* kReplicaKeyPrefix = "ddprun_replica/";
inline constexpr std::chrono::seconds kReplicaExchangeTimeout{30};

// Steps 1-4 for assignment `a`; `log` prints one fenced line.
void ExchangeReplicas(ReplicaService& service, CheckpointMemory& memory,
                      const rendezvous::Assignment& a, const std::string& job_id,
                      const std::function<void(const std::string&)>& log);

}  // namespace ddprun::agent

#endif  // DDPRUN_AGENT_SRC_REPLICA_EXCHANGE_H_
