// The workers' TCPStore of one round (MASTER_ADDR:MASTER_PORT on group rank
// 0's node), shared by the gRPC and in-process rendezvous sessions.
#ifndef DDPRUN_AGENT_SRC_ROUND_STORE_H_
#define DDPRUN_AGENT_SRC_ROUND_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"

namespace ddprun::agent {

// Starts a fresh store on every interface and an OS-picked port. Every round
// gets its own, so that keys of an earlier round (the same
// /worker/attempt_<n> prefix after a scale-up) cannot leak into the next.
// Errors are Unavailable and name the store.
inline absl::StatusOr<std::unique_ptr<rendezvous::C10dStoreServer>> StartRoundStore() {
  rendezvous::C10dStoreServerOptions so;
  so.host = "0.0.0.0";
  so.port = 0;
  auto store = rendezvous::C10dStoreServer::Start(so);
  if (!store.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the workers' TCPStore: ", store.status().message()));
  }
  return store;
}

}  // namespace ddprun::agent

#endif  // DDPRUN_AGENT_SRC_ROUND_STORE_H_
