// The client side of the rendezvous protocol, used by agents (Join, Report)
// and by workers through GrpcStore. The gRPC types stay behind the pimpl.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/common/tls.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"
#include "ddprun/rendezvous/store/store.h"

namespace ddprun::rendezvous {

class RendezvousClient;

// One Join call: a stream of RoundEvents for one round. Thread-safe Cancel().
class JoinStream {
 public:
  virtual ~JoinStream() = default;
  // Blocks for the next event. A Status event ends the stream: the server's
  // refusal, DeadlineExceeded after `timeout`, or Unavailable when the
  // connection broke.
  virtual RoundEvent Next(Duration timeout) = 0;
  // Ends the stream from our side (another thread may be in Next()).
  virtual void Cancel() = 0;
};

// How soon a client gives up on a server gone silent (a host lost, a network
// cut): gRPC keepalive pings each second while a call is open, then waits this
// long for the answer. kFailover (500 ms) is for agents that list ddprund
// replicas and have somewhere else to go (docs/ha.md); kPatient (1 s) for the
// rest, where a loaded server slow to answer is better waited for.
enum class SilenceTimeout { kPatient, kFailover };

class RendezvousClient {
 public:
  // Creates a channel; does not connect yet. `tls` (LoadClientTls) disabled:
  // plaintext.
  static std::unique_ptr<RendezvousClient> Create(
      const std::string& host, int port, const TlsConfig& tls = {},
      SilenceTimeout silence = SilenceTimeout::kPatient);
  ~RendezvousClient();

  // Waits until the server accepts a connection, up to timeout. A server
  // that is there but refuses the TLS handshake (either side's certificate,
  // or one side without TLS) is TlsHandshakeError (tls.h, kind kAuth) naming
  // the reason and the flag to fix: retrying cannot help.
  absl::Status WaitForConnected(Duration timeout);
  // Whether the last attempt to connect failed outright (refused, reset,
  // unreachable: gRPC's TRANSIENT_FAILURE), as opposed to still connecting
  // (a slow or silent peer). Does not start a connection.
  bool ConnectFailed() const;
  std::unique_ptr<JoinStream> Join(const JoinSpec& spec);
  absl::Status Report(const std::string& job_id, const std::string& node_id, std::int64_t round,
                      Outcome outcome, const std::vector<WorkerFailure>& failures,
                      Duration timeout);
  absl::StatusOr<std::vector<JobStatus>> Status(const std::string& job_id, Duration timeout);
  // Monitoring: this node's report; the server's requests come back. An old
  // server answers UNIMPLEMENTED. Thread-safe (the agent's reporter thread).
  absl::StatusOr<MetricsReply> ReportMetrics(const MetricsReport& report, Duration timeout);
  // Monitoring: the job's view as JSON (docs/monitoring.md), the same
  // document as the dashboard's /api/v1/jobs/<job>. NotFound for an unknown job.
  absl::StatusOr<std::string> GetMetrics(const std::string& job_id, Duration timeout);
  const std::string& target() const;

 private:
  friend class GrpcStore;
  class Impl;
  explicit RendezvousClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The Store over gRPC, scoped to one job and round (StoreScope, types.h) and
// authenticated with the job's store token. Thread-safe.
class GrpcStore final : public Store {
 public:
  GrpcStore(const std::string& host, int port, StoreScope scope, const TlsConfig& tls = {});
  // Replicas of one control plane (docs/ha.md), the first tried first: a call
  // moves on to the next replica when one is down, is a standby, or its
  // connection broke during a call that can be repeated (Set, Get, Wait,
  // MultiGet, Delete; not Add or CompareSet), within the call's own deadline.
  GrpcStore(const std::vector<HostPort>& replicas, StoreScope scope, const TlsConfig& tls = {});
  // Waits up to `timeout` for a connection. Ok also when the server is merely
  // not there yet (calls wait for it); TlsHandshakeError when it is there but
  // the TLS handshake is refused, as RendezvousClient::WaitForConnected.
  absl::Status CheckTls(Duration timeout);
  ~GrpcStore() override;
  // The replica that answered last (the first one until a call answered).
  HostPort endpoint() const;
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  absl::StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta) override;
  absl::StatusOr<bool> CompareSet(const std::string& key, const std::optional<std::string>& expected,
                                  const std::string& desired, std::string* current) override;
  absl::Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    Duration timeout) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
