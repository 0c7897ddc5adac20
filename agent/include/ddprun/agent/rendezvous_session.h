// The agent's side of the rendezvous, behind an interface so that the round
// loop (agent.cc) is unit-tested against an in-process session over the real
// round state machine, with a fake clock and no sockets.
//
// The mode contract (AgentOptions::mode, decided once by the launcher; the
// session only reads it):
//   kEmbedded  host a RendezvousServer on rdzv_host:rdzv_port (port 0: the
//              OS picks; an empty or wildcard host binds every interface and
//              connects over 127.0.0.1), then join it.
//   kRemote    join the server at rdzv_host:rdzv_port (port > 0). When the
//              endpoint names this machine and nothing answers there, host it
//              (torchrun's c10d is_host); another local agent may win the bind.
//   kStatic    torchrun's static backend: node_rank >= 0 and min_nodes ==
//              max_nodes (the launcher guarantees both). Node rank 0 serves
//              the workers' TCPStore on master_addr:master_port and hosts the
//              rendezvous on port 0, publishing its endpoint in that store;
//              the other nodes read it from there.
// Every other mode serves a fresh TCPStore on port 0 for each round
// (PrepareRound), advertised as the round's MASTER_PORT.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/events.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::agent {

class RendezvousSession {
 public:
  virtual ~RendezvousSession() = default;

  // Brings up or reaches the rendezvous as the mode says, by `deadline`.
  // `interrupted` is polled between the slices of blocking waits; when it
  // returns true, Open returns a Cancelled status. Errors are one line naming
  // the endpoint and the fix.
  virtual absl::Status Open(rendezvous::TimePoint deadline,
                            const std::function<bool()>& interrupted) = 0;
  // Before each round's join: a fresh store for the workers (not kStatic).
  virtual absl::Status PrepareRound() = 0;
  // The MASTER_PORT this node offers for the round (the store above).
  virtual int master_port() const = 0;
  // host:port of the rendezvous: DDPRUN_STORE_ADDR, and for messages.
  virtual std::string endpoint() const = 0;
  // The address other nodes reach this node at: --local_addr, 127.0.0.1 when
  // the rendezvous is on loopback, else the hostname.
  virtual std::string advertised_host() const = 0;
  // Whether this agent hosts the rendezvous server (it must then stay up
  // until the job ends, and cannot re-attach to itself).
  virtual bool hosts_rendezvous() const = 0;
  // Whether the rendezvous is several ddprund replicas (docs/ha.md): a broken
  // or refused stream is then retried on the next one (WaitForConnected moves
  // on), also while a round gathers.
  virtual bool has_replicas() const { return false; }

  // Starts a Join (ending the previous one). Its events arrive on `events`
  // as StreamEvent{id} with the returned id (never 0); the stream ends after
  // any event but an Assignment.
  virtual std::uint64_t Join(const rendezvous::JoinSpec& spec, EventQueue& events) = 0;
  // Ends the current Join; its later events are stale.
  virtual void EndJoin() = 0;
  // Waits up to `timeout` for the connection to the rendezvous (re-attach).
  // With replicas, tries the next replica first, then the others in turn.
  virtual absl::Status WaitForConnected(rendezvous::Duration timeout) = 0;
  virtual absl::Status Report(const rendezvous::Assignment& assignment, rendezvous::Outcome outcome,
                              const std::vector<rendezvous::WorkerFailure>& failures,
                              rendezvous::Duration timeout) = 0;
  // The job as the rendezvous sees it (nodes gathered, deadlines).
  virtual absl::StatusOr<rendezvous::JobStatus> JobStatus(rendezvous::Duration timeout) = 0;
  // Monitoring (docs/monitoring-sources.md): this node's report, about once
  // a second; the reply carries the server's requests (stacks to take, a hang
  // report to print). Called on the agent's reporter thread, between Open()
  // and Close(), concurrently with the main thread's calls: implementations
  // make this call thread-safe. UNIMPLEMENTED: the server has no monitoring
  // (an older ddprund), and the agent stops reporting.
  virtual absl::StatusOr<rendezvous::MetricsReply> ReportMetrics(
      const rendezvous::MetricsReport& report, rendezvous::Duration timeout) {
    return absl::UnimplementedError("this rendezvous session has no monitoring");
  }
  // The keys that workers wait for in the round's TCPStore that this node
  // hosts and nobody has set yet, at most `max` (hang reports name them);
  // empty when it hosts none. Called on the reporter thread, like
  // ReportMetrics.
  virtual std::vector<std::string> StoreWaitedKeys(std::size_t max) { return {}; }
  // Before the round's workers are spawned: the TCPStore their SDK
  // bootstraps through (DDPRUN_TCPSTORE_ADDR), once the round's job key is
  // written there (rendezvous/sdk_store_scope.h); "" (the default): the gRPC
  // Store at endpoint(). Only the in-process session answers one: its job can
  // only ever have this node, so the round's store is this process's and
  // every worker reaches it on loopback; the gRPC session's jobs (several
  // nodes, TLS, replicas, static) keep the gRPC Store.
  virtual absl::StatusOr<std::string> OpenSdkStore(const rendezvous::Assignment&) {
    return std::string();
  }
  // The first round's workers have been running for a moment (agent.cc's
  // kServicesDelay, 100 ms). A session starts here what the workers do not
  // need (the in-process rendezvous: its acceptor, its hub's ticker, its
  // dashboard's I/O thread), so that those threads are neither on the way to
  // the first spawn nor in a job that is over by then (docs/launch.md).
  // Listening sockets exist from Open(): a client that connects earlier
  // waits in the backlog until then. Idempotent.
  virtual void WorkersStarted() {}
  // The agent is done: ends, in order, what other processes rely on in this
  // session (its Join stream; a rendezvous server that other agents or
  // gRPC clients use). What is left to Close() is this process's threads and
  // sockets whose peers lose nothing when they close with the process (the
  // workers' store after the workers; a dashboard connection), so that a
  // process ending right after Leave() may leave it to the kernel
  // (launcher/src/main.cc). Default: Close().
  virtual void Leave() { Close(); }
  // Ends every stream and stops what the session serves. Idempotent, and
  // also after Leave().
  virtual void Close() = 0;
};

// The real session: gRPC client (rendezvous/client.h), the embedded server
// and the workers' TCPStore, as the mode says.
std::unique_ptr<RendezvousSession> MakeGrpcRendezvousSession(const AgentOptions& options,
                                                             const rendezvous::Clock& clock);

// Whether the job can only ever be this node (kEmbedded, max_nodes 1) and
// speaks plaintext (no --tls_* file): its rendezvous then runs in this
// process (local_rendezvous_session.cc). With TLS the gRPC session hosts it.
bool RunsRendezvousInProcess(const AgentOptions& options);
// The single-node session: the JobTable in process, its endpoint listening
// from Open() and served over gRPC from the first client on.
std::unique_ptr<RendezvousSession> MakeLocalRendezvousSession(const AgentOptions& options,
                                                              const rendezvous::Clock& clock);
// The agent's default: the local session when RunsRendezvousInProcess, else
// the gRPC session from the gRPC module (grpc_module.h), loaded here.
std::unique_ptr<RendezvousSession> MakeRendezvousSession(const AgentOptions& options,
                                                         const rendezvous::Clock& clock);

}  // namespace ddprun::agent
