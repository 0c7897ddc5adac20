// Where the job table keeps its jobs across a restart of the server: StateLog
// (--state_dir, ddprun/rendezvous/ha/state_log.h) and EtcdJournal (ha/etcd_journal.h);
// tests use an in-memory one. No proto types: the format is the implementation's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {

// One job as the journal last saw it.
struct RecoveredJob {
  JobSnapshot snapshot;
  std::int64_t store_round = 0;
  std::vector<std::pair<std::string, std::string>> store;  // that round's keys
  std::vector<std::string> warnings;                       // one line each, for the operator
};

// Thread-safe. Every write is durable when it returns (the table answers
// clients only after that).
class JobJournal {
 public:
  virtual ~JobJournal() = default;
  // Every job written and not forgotten.
  virtual absl::StatusOr<std::vector<RecoveredJob>> Recover() = 0;
  // Replaces what is kept for the job with snap and the store of store_round.
  virtual absl::Status WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                                     const KvEngine& store) = 0;
  // Records the current value of key in store (or its deletion).
  virtual absl::Status AppendKey(const std::string& job_id, std::int64_t round,
                                 const std::string& key, const KvEngine& store) = 0;
  // Drops the job (it was forgotten).
  virtual void Forget(const std::string& job_id) = 0;
  // Whether AppendKey could persist a value of value_bytes at key: checked
  // before the store takes the value, so that a value the journal must refuse
  // is never seen by a reader. InvalidArgument naming the limit and the fix.
  virtual absl::Status CheckStoreValue(const std::string& job_id, std::int64_t round,
                                       const std::string& key, std::size_t value_bytes) const {
    (void)job_id, (void)round, (void)key, (void)value_bytes;
    return absl::OkStatus();
  }
};

}  // namespace ddprun::rendezvous
