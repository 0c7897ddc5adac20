// A server that speaks PyTorch's c10d TCPStore wire protocol, so that an
// unmodified `init_process_group(init_method="env://")` in a worker connects
// to MASTER_ADDR:MASTER_PORT as a client (TORCHELASTIC_USE_AGENT_STORE=True).
//
// The agent binds it on port 0 *before* starting workers and keeps it bound
// for the job's life, so MASTER_PORT can never race (pytorch#85604, #126510,
// #73320). It serves torch 1.13 clients (no handshake) and torch 2.x clients
// (VALIDATE handshake with magic number, PING, MULTI_GET, ...), detected per
// connection from the first bytes.
//
// One thread runs a poll(2) loop over the listening socket and every client.
// Blocking queries (WAIT) are parked on the KvEngine and answered when their
// keys appear; a client that disconnects cancels its waits.
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
  // in use or the address cannot be bound.
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

// A minimal client of the same protocol (torch 2.x dialect, as the torch 2
// client speaks it). Used by static-rendezvous agents to read keys published
// by node rank 0, and by tests. Not thread-safe.
class C10dStoreClient {
 public:
  // Connects, retrying until `timeout_s` elapses.
  static absl::StatusOr<std::unique_ptr<C10dStoreClient>> Connect(const std::string& host, int port,
                                                                  double timeout_s);
  ~C10dStoreClient();
  absl::Status Set(const std::string& key, const std::string& value);
  // WAIT (up to timeout_s) then GET.
  absl::StatusOr<std::string> Get(const std::string& key, double timeout_s);
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta);

 private:
  explicit C10dStoreClient(int fd);
  int fd_;
};

}  // namespace ddprun::rendezvous
