// The JobJournal of a replicated ddprund (--etcd_endpoints): what StateLog
// keeps in --state_dir, kept in etcd instead, written only by the replica that
// leads. Layout under the prefix P (--etcd_prefix, default /ddprun):
//
//   P/format                          "ddprun-ha-1": this prefix is ddprun's
//   P/leader                          the leading replica's address (its lease)
//   P/jobs/<hex job id>/head          which snapshot version is the job's
//                                     (etcd_snapshot_chunks.h: version, chunk count, sizes, CRC)
//   P/jobs/<hex job id>/snapshot/<version, 20 digits>/<chunk, 8 digits>
//                                     the JobSnapshot (state.proto), zlib-compressed, in
//                                     chunks that each fit one etcd request
//   P/jobs/<hex job id>/snapshot      the whole JobSnapshot in one value: the layout before
//                                     chunks, still read; the next write replaces it
//   P/jobs/<hex job id>/store/<round, 20 digits>/<key>   a store key of that round
//
// Fencing ("nothing decided twice"): every write is one Txn whose compare is
// create_revision(P/leader) == the revision at which this replica created it.
// A replica that lost the leadership (its lease expired and another replica
// created the key) can never write: the compare fails, on_deposed runs and
// nothing it decided since is delivered. Writes that cannot reach a quorum are
// retried while the replica's lease is known to be alive (the control plane
// waits, naming etcd), then on_deposed runs too.
//
// Size (etcd refuses a request over its --max-request-bytes, 1.5 MiB by
// default; ddprund is told that limit by --etcd_max_request_bytes): a
// snapshot is written as version v+1 of the job, its chunks but the last one
// Txn each, then one Txn that puts the last chunk and the head (pointing at
// v+1) and deletes every other version's chunks. A version without a head
// pointing at it is an unfinished write: Recover ignores it, the next write
// deletes it. A store value whose write cannot fit one request is refused
// before the store takes it (CheckStoreValue).
//
// Writes per round: one Txn per change of a job's state (a round formed,
// restarted, closed; a report) while its compressed snapshot fits one chunk
// (about 45k members at etcd's default limit, docs/benchmarks.md), one more
// per further chunk; one per store write. Snapshots never rewrite store keys:
// a new round's snapshot deletes the older rounds' keys in its last Txn.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "ddprun/rendezvous/ha/etcd_client.h"
#include "ddprun/rendezvous/job_journal.h"

namespace ddprun::rendezvous {

inline constexpr const char* kEtcdFormat = "ddprun-ha-1";

// "/ddprun", "/team/ddprun" -> itself without a trailing '/'; InvalidArgument
// for anything that does not start with '/' or holds a control character.
absl::StatusOr<std::string> NormalizeEtcdPrefix(const std::string& prefix);

// Checks that the prefix is ddprun's (P/format) or empty (then claims it).
// Unavailable when etcd cannot be reached; FailedPrecondition naming a key when
// another program's data (or another format) lives there. Safe to call from any
// number of replicas at once on a fresh prefix: the marker is created in one
// transaction only while nothing lives under the prefix, so every caller
// succeeds and it is written once.
absl::Status ClaimEtcdPrefix(EtcdClient& client, const std::string& prefix);

struct EtcdJournalOptions {
  EtcdClient* client = nullptr;
  std::string prefix;  // normalized
  // Whether this replica's lease is still known to be alive.
  std::function<bool()> may_lead;
  // The leadership is lost; called once, before the write returns an error.
  std::function<void(absl::Status)> on_deposed;
  // etcd's --max-request-bytes (its default): no request is larger.
  std::size_t max_request_bytes = static_cast<std::size_t>(kEtcdDefaultMaxRequestBytes);
};

class EtcdJournal final : public JobJournal {
 public:
  explicit EtcdJournal(EtcdJournalOptions options);

  // The revision at which this replica created P/leader; every write compares it.
  void SetLeaderRevision(std::int64_t revision) { leader_revision_.store(revision); }

  absl::StatusOr<std::vector<RecoveredJob>> Recover() override;
  absl::Status WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                             const KvEngine& store) override;
  absl::Status AppendKey(const std::string& job_id, std::int64_t round, const std::string& key,
                         const KvEngine& store) override;
  void Forget(const std::string& job_id) override;
  absl::Status CheckStoreValue(const std::string& job_id, std::int64_t round,
                               const std::string& key, std::size_t value_bytes) const override;

  // Fenced writes made (for the benchmark's writes per round).
  std::int64_t writes() const { return writes_.load(); }

 private:
  std::string JobPrefix(const std::string& job_id) const;
  std::string StoreKey(const std::string& job_id, std::int64_t round, const std::string& key) const;
  // One fenced Txn, retried while the lease lives. A request etcd refuses as
  // bad input (too large: its --max-request-bytes) is InvalidArgument naming
  // the limit and the fix.
  absl::Status Write(std::vector<EtcdOp> ops);
  // The bytes left for values in one request whose keys are these.
  std::size_t RoomForValues(std::size_t key_bytes) const;

  EtcdJournalOptions options_;
  std::atomic<std::int64_t> leader_revision_{0};
  std::atomic<std::int64_t> writes_{0};
  std::mutex mu_;  // orders AppendKey's read of a value with its write
  std::atomic<bool> deposed_{false};
  std::mutex versions_mu_;
  std::map<std::string, std::int64_t> versions_;  // by job id: the snapshot version head names
};

}  // namespace ddprun::rendezvous
