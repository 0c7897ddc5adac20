// Leader election among ddprund replicas through etcd. Each replica holds a
// lease (TTL --etcd_lease_ttl, renewed over a stream every TTL/3) and tries a
// create-if-absent Txn on P/leader with its address, attached to the lease.
// The one whose Txn succeeds leads; the others watch P/leader and try again
// when it is deleted (the leader stopped and revoked its lease, or its lease
// expired: a killed replica is replaced within the TTL).
//
// The leader keeps the revision at which it created P/leader; its writes
// compare it (etcd_journal.h), so a replica that lost the key cannot write.
// A leader whose lease is lost (etcd says so, or no renewal within the TTL)
// calls on_deposed once and leads no more: ddprund exits, and its agents
// move to the next replica (fail-stop, as Kubernetes' controllers do).
//
// Threads: one, that campaigns, watches, and runs the callbacks.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "ddprun/rendezvous/ha/etcd_client.h"

namespace ddprun::rendezvous {

struct EtcdElectionOptions {
  EtcdClient* client = nullptr;
  std::string prefix;   // normalized (etcd_journal.h)
  std::string address;  // this replica's, as agents reach it ("H:P")
  std::int64_t lease_ttl_s = 2;
  // Called once on this thread when this replica leads, with the revision at
  // which it created P/leader. Serving starts when it returns.
  std::function<void(std::int64_t revision)> on_elected;
  // Called once when the leadership is lost after on_elected.
  std::function<void(absl::Status)> on_deposed;
  // Called on this thread each time the campaign finds another replica
  // leading, and it is not the one last reported (null: not told).
  std::function<void(const std::string& leader)> on_standby;
};

class EtcdElection {
 public:
  explicit EtcdElection(EtcdElectionOptions options);
  // Stops campaigning; a leader revokes its lease, so that another replica
  // takes over at once.
  ~EtcdElection();

  // Whether this replica leads and its lease is known to be alive.
  bool MayLead() const;
  bool leading() const;
  // Whether this replica's current lease is alive (renewed within its TTL):
  // etcd answers this replica, leader or standby.
  bool LeaseAlive() const;
  // The leading replica's address as last seen ("" when unknown).
  std::string leader() const;

 private:
  void Run();
  void Pause(std::chrono::milliseconds d);
  void Log(const std::string& line);

  EtcdElectionOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool leading_ = false;
  bool lost_ = false;         // the current lease is gone
  bool key_deleted_ = false;  // P/leader was deleted (watch)
  std::string leader_;
  std::unique_ptr<EtcdLeaseKeeper> keeper_;
  std::int64_t lease_id_ = 0;
  std::chrono::steady_clock::time_point last_notice_{};
  bool ttl_noted_ = false;  // etcd raised the TTL: said once (election thread only)
  std::thread thread_;
};

}  // namespace ddprun::rendezvous
