// The rendezvous server: the Rendezvous and Store gRPC services over the
// round state machine of every job. ddprund runs one; ddprun embeds one when
// it hosts the rendezvous itself. The gRPC types stay behind the pimpl.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/clock.h"
#include "ddprun/rendezvous/host_port.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/types.h"

namespace ddprun::rendezvous {

inline constexpr int kMaxMessageBytes = 8 << 20;
inline constexpr Duration kDefaultLeaseTimeout = std::chrono::seconds(4);

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = kDefaultRdzvPort;  // 0: the OS picks one; see RendezvousServer::port().
  // What a failure to listen tells the user to do (the caller knows its flags).
  std::string listen_fix = "pick another port or stop the process that holds it";
  // Deadlines (last call, join, reattach and store-wait timeouts) are applied
  // when they pass: the server waits for the next one, it does not poll.
  const Clock* clock = &SystemClock::Get();
  // Where jobs and their stores are persisted (fsync) so that a restarted
  // server resumes them; "" keeps everything in memory.
  std::string state_dir;
  // How long a restored member has to re-attach before it counts as lost.
  Duration reattach_timeout = kDefaultReattachTimeout;
  // An agent whose connection is silent this long (cut network) is lost.
  Duration lease_timeout = kDefaultLeaseTimeout;
  // Hosts that keep failing are refused for a while (see job_rendezvous.h).
  QuarantinePolicy quarantine;
  // Serve this table instead of a table of the server's own (borrowed; it
  // must outlive the server). Its owner has recovered it and applies its
  // deadlines; state_dir, reattach_timeout and quarantine are then unused.
  // ddprun's single-node agent owns its table and starts a server over it
  // only when a client first connects (agent/src/local_rendezvous_session.cc).
  JobTable* table = nullptr;
  // Listen on no port: connections accepted elsewhere are handed in with
  // RendezvousServer::HandOver(); port() is then `port` as given.
  bool external_connections = false;
};

class RendezvousServer {
 public:
  // Binds and starts serving. Fails with a one-line message: Unavailable
  // "cannot listen on HOST:PORT: <why>; <listen_fix>" if the port is in use,
  // or the state directory's error.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const ServerOptions& opts);
  ~RendezvousServer();  // Shutdown() then join.

  int port() const;
  // Serves an accepted connection (takes the fd; external_connections only).
  // `first_bytes` were read from it already and are served first.
  void HandOver(int fd, const std::string& first_bytes = "");
  // Stops accepting calls and ends every open stream (with a deadline).
  void Shutdown();
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // A snapshot of every job (for `ddprun status` and tests).
  std::vector<JobStatus> Status() const;

  class Impl;  // opaque; defined in server.cc

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
