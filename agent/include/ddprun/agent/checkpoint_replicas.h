// --ckpt_replicas 1 (docs/checkpoint.md, "Peer replicas"): the transport of
// the replica protocol (checkpoint_replica_wire.h) between agents.
//
//  - A server on the agent's advertised address (port 0: the OS picks;
//    published per round through the round's TCPStore by agent.cc) receives
//    its predecessor's snapshots (kPut) into its ReplicaStore and hands a
//    held replica to the node that takes a lost node's seat (kGet). Every
//    request is checked against the job id, the job's store token and the
//    current round; a refused or garbage connection is dropped with at most
//    one line per second, and a connection's whole exchange has a deadline.
//  - A sender thread polls this node's commit records (every kPollInterval)
//    and, when every local rank committed a step newer than the one its
//    successor holds, streams the snapshots there, one local rank at a time
//    (straight from the slot; its record is checked after the bytes are
//    sent, so a slot saved over meanwhile aborts the send and the next poll
//    tries again; the CRC-32 is checked by the fetching node). It keeps
//    each local rank's replica gate (CheckpointMemory::SetReplicaAcked):
//    closed while a successor is set, up to the newest acknowledged
//    snapshot, so a save returns only once its step is replicated; open
//    while there is no successor or sending to it fails (docs/checkpoint.md,
//    "Replica lag").
//  - Fetch: the client side of kGet, for the restore before a round's
//    workers start.
//
// Threads: its own; SetRound and the accessors from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/agent/background_priority.h"
#include "ddprun/agent/bandwidth_limit.h"
#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_replica_store.h"
#include "ddprun/agent/checkpoint_replica_wire.h"
#include "ddprun/agent/replica_channel.h"
#include "ddprun/rendezvous/common/job_policy.h"

namespace ddprun::agent {

// A replica fetched from its holder, every rank's bytes checked against its
// CRC-32.
struct FetchedReplica {
  std::int64_t step = 0;
  std::vector<std::string> bytes;  // one per local rank of the seat (Fetch into strings)
  // Per local rank, as the holder stated them (and checked).
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint32_t> crcs;
  std::vector<std::uint32_t> kinds;
};

class ReplicaService {
 public:
  using LogFn = std::function<void(const std::string&)>;  // one line, from any thread
  using Clock = std::chrono::steady_clock;
  // A save may wait on the sender (the gate): a short poll keeps that wait
  // near the transfer itself. Each poll reads two records per local rank.
  static constexpr std::chrono::milliseconds kPollInterval{5};
  // After a send that failed in transport, the next try waits this long.
  static constexpr std::chrono::milliseconds kRetryInterval{200};
  // The whole exchange of one connection (a replica of many GiB fits).
  static constexpr std::chrono::seconds kIoTimeout{120};
  // A request's prefix and header (a peer that connects and says nothing).
  static constexpr std::chrono::seconds kHeaderTimeout{10};
  static constexpr int kMaxConnections = 8;

  struct Options {
    std::string job_id;
    std::string host;               // the advertised address to bind
    std::uint64_t limit_bytes = 0;  // --ckpt_shm_limit: the largest snapshot held
    std::uint64_t bandwidth = 0;    // --ckpt_bandwidth: the sender's bytes/s (0: no limit)
    // --ckpt_encrypt (the job's): every connection, both ways, in
    // AES-256-GCM records after its handshake (replica_channel.h); a peer
    // of the other setting is refused.
    bool encrypt = rendezvous::JobPolicy{}.ckpt_encrypt != 0;
    // The agent's (may be null; outlives the service): the acceptor
    // ("ckpt-accept"), the sender ("ckpt-send") and each connection's
    // thread ("ckpt-recv": receives a replica or serves a fetch) join it
    // and run on its CPUs (background_priority.h).
    BackgroundThreads* background = nullptr;
  };

  // `memory` (may be null: serve only) outlives this object.
  ReplicaService(Options options, CheckpointMemory* memory, LogFn log);
  ~ReplicaService();  // Stop()
  ReplicaService(const ReplicaService&) = delete;
  ReplicaService& operator=(const ReplicaService&) = delete;

  // Listens on host:0 and starts the threads. An error names the address.
  absl::Status Start();
  // Ends the threads; connections in progress are cut. Idempotent.
  void Stop();
  // host:port this node's server listens on.
  std::string endpoint() const { return endpoint_; }
  ReplicaStore& store() { return store_; }
  bool encrypt() const { return options_.encrypt; }

  // The round's fence (requests of another round, job or token are
  // refused) and where this node's snapshots go ("": nowhere).
  void SetRound(std::int64_t round, const std::string& token, const std::string& successor);
  // Stops sending (the round is over; the next one names its successor)
  // and opens the replica gates.
  void ClearSuccessor();
  // The newest step the current successor acknowledged (-1: none yet).
  std::int64_t sent_step() const { return sent_step_.load(); }

  // Sends one replica (`data`: one span per local rank, as h.sizes) and
  // waits for the answer, over a channel encrypted when `encrypt` (the
  // job's --ckpt_encrypt; the peer's must be the same). A refusal is
  // FailedPrecondition with the peer's line; transport errors Unavailable or
  // DeadlineExceeded; a record that fails its tag DataLoss.
  static absl::Status Put(const std::string& endpoint, const replica::Header& h,
                          const std::vector<std::string_view>& data, Clock::time_point deadline,
                          bool encrypt);
  // Fetches the newest replica of `seat` from `endpoint` (the sink's
  // overload: the one of `step`, or the newest with replica::kNewestStep).
  // NotFound with the holder's line when it holds none or refuses (fence);
  // DataLoss when a rank's bytes do not match their CRC-32.
  static absl::StatusOr<FetchedReplica> Fetch(const std::string& endpoint,
                                              const std::string& job_id, const std::string& token,
                                              std::int64_t round, const replica::Seat& seat,
                                              std::uint64_t limit_bytes, Clock::time_point deadline,
                                              bool encrypt);
  // Where Fetch puts local rank j's `size` bytes: memory valid until Fetch
  // returns (the restore's: the rank's checkpoint memory, so the bytes are
  // received in place, checked piece by piece as they arrive, and never
  // copied again). An error ends the fetch with it.
  using FetchSink = std::function<absl::StatusOr<char*>(int local_rank, std::uint64_t size)>;
  static absl::StatusOr<FetchedReplica> Fetch(const std::string& endpoint,
                                              const std::string& job_id, const std::string& token,
                                              std::int64_t round, const replica::Seat& seat,
                                              std::uint64_t limit_bytes, Clock::time_point deadline,
                                              bool encrypt, const FetchSink& sink,
                                              std::int64_t step = replica::kNewestStep);

 private:
  void AcceptLoop();
  void Serve(int fd, std::string peer, std::uint64_t id);
  void SendLoop();
  void SendNewest();
  // Sends local rank's committed slot `s` from its memory; false when the
  // slot no longer holds that commit afterwards (saved over meanwhile).
  absl::StatusOr<bool> SendSlot(replica::Channel& ch, int local_rank, const CommittedSnapshot& s,
                                Clock::time_point deadline);
  // Every local rank's gate open (false) or closed with nothing
  // acknowledged; the caller holds mu_.
  void SetGatesLocked(bool closed);
  // At most one line per second; the others are counted into the next.
  void LogLimited(const std::string& msg);

  const Options options_;
  CheckpointMemory* memory_;
  LogFn log_;
  ReplicaStore store_;
  std::string endpoint_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends AcceptLoop
  std::thread accept_thread_;
  std::thread send_thread_;

  std::mutex mu_;  // everything below until the atomics
  std::condition_variable cv_;
  bool stop_ = false;
  std::int64_t round_ = -1;
  std::string token_;
  std::string successor_;
  std::set<int> open_fds_;                             // connections being served, cut by Stop
  std::map<std::uint64_t, std::thread> conn_threads_;  // by id
  std::vector<std::uint64_t> finished_;  // ids of returned threads, joined by AcceptLoop
  std::uint64_t next_conn_ = 0;
  int active_ = 0;
  Clock::time_point last_line_{};
  int suppressed_ = 0;
  bool refused_large_ = false;  // a too large replica: said once until one fits
  bool said_no_cipher_ = false;  // --ckpt_encrypt without libcrypto: said once
  bool reassert_ = false;       // SetRound closed the gates; the sender restores them

  // The sender's own.
  BandwidthLimit send_pace_;  // options_.bandwidth
  std::string sent_to_;
  std::int64_t refused_step_ = -1;
  // What sent_to_ acknowledged, per local rank: (memory epoch, generation).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> acked_;
  std::chrono::milliseconds test_delay_{0};  // kEnvTestReplicaDelayMs
  bool test_corrupt_older_ = false;          // kEnvTestReplicaCorruptOlder
  Clock::time_point retry_at_{};
  bool send_failing_ = false;
  std::atomic<std::int64_t> sent_step_{-1};
};

}  // namespace ddprun::agent
