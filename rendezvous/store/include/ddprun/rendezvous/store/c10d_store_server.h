// A server that speaks PyTorch's c10d TCPStore wire protocol, so that an
// unmodified `init_process_group(init_method="env://")` in a worker connects
// to MASTER_ADDR:MASTER_PORT as a client (TORCHELASTIC_USE_AGENT_STORE=True).
//
// The agent binds it on port 0 *before* starting workers and keeps it bound
// for the job's life, so MASTER_PORT can never race (pytorch#85604, #126510,
// #73320). It serves torch 1.13 clients (no handshake) and torch 2.x clients
// (VALIDATE handshake with magic number, PING, MULTI_GET, ...), detected per
// connection from the first bytes (the wire is c10d_wire.h, the semantics
// c10d_store_handler.h).
//
// One thread runs a level-triggered epoll loop over the listening socket and
// every client; work per round is proportional to the ready connections.
// Blocking queries (WAIT) are parked on the KvEngine and answered when their
// keys appear; a client that disconnects cancels its waits. Limits: as many
// connections as the open-file limit allows (at the limit accepting pauses,
// with a line naming `ulimit -n`, until a client leaves); a client whose
// unread replies pass 4 MiB is not read until it drains, and is disconnected
// past 64 MiB; at most 1 MiB read from one client per round. A malformed
// request closes that connection only, with a (rate-limited) line on stderr.
//
// Not supported (the connection is closed with a log line): WATCH_KEY, the
// queue queries and anything newer than QUEUE_LEN (e.g. LIST_KEYS), which
// env:// rendezvous and the gloo/NCCL process groups do not send.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::rendezvous {

class KvEngine;

struct C10dStoreServerOptions {
  std::string host = "0.0.0.0";  // address to bind.
  int port = 0;                  // 0: the OS picks a free port.
};

class C10dStoreServer {
 public:
  // Binds and starts serving. Fails with a one-line message when the port is
  // in use or the address cannot be bound: AlreadyExists (port in use),
  // PermissionDenied (a privileged port), InvalidArgument (bad port or host),
  // Unavailable or ResourceExhausted otherwise.
  static absl::StatusOr<std::unique_ptr<C10dStoreServer>> Start(const C10dStoreServerOptions& opts);
  ~C10dStoreServer();  // Stops the thread and closes every socket.

  int port() const;
  // The engine that holds the data (shared with the agent, e.g. to publish keys).
  KvEngine& engine();

 private:
  class Impl;
  explicit C10dStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Each torch 1.13 worker opens two connections to the store (torch 2.x one).
inline constexpr int kStoreConnectionsPerWorker = 2;
// Descriptors the serving process keeps for itself besides its clients.
inline constexpr std::uint64_t kStoreReservedFiles = 64;

// Raises this process's soft RLIMIT_NOFILE to its hard limit; returns the soft
// limit now in force (0 when it cannot be read).
std::uint64_t RaiseOpenFileLimit();

// "" when a store serving `workers` workers fits `open_file_limit`; otherwise a
// one-line warning that names the count needed and `ulimit -n`.
std::string StoreCapacityWarning(std::int64_t workers, std::uint64_t open_file_limit);

}  // namespace ddprun::rendezvous
