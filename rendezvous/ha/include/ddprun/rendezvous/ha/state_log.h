// ddprund's durable state (--state_dir): one log file per job under
// <state_dir>/jobs/, holding framed StateRecords (state.proto):
//
//   [u32 length, little endian][u32 crc32 of the record][record bytes]
//
// The first record is a JobSnapshot followed by the store keys of its round;
// later records are store keys written since. A new snapshot rewrites the
// file (write to a temporary file, fsync, rename, fsync the directory), so a
// crash leaves either the old file or the new one. Appends are fsynced before
// the client is answered.
//
// Recovery refuses a file whose complete record fails its checksum or does
// not parse, with a message naming the file and the fix; a record cut short
// at the very end (a crash mid-append) is dropped with a warning.
//
// Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/job_journal.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/store/kv_engine.h"

namespace ddprun::rendezvous {

class StateLog final : public JobJournal {
 public:
  // Creates <dir>/jobs if needed and checks that it is writable.
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(const std::string& dir);

  // Reads every job file.
  absl::StatusOr<std::vector<RecoveredJob>> Recover() override;

  // Rewrites the job's file with snap and the store of store_round.
  absl::Status WriteSnapshot(const JobSnapshot& snap, std::int64_t store_round,
                             const KvEngine& store) override;
  // Appends the current value of key in store (or its deletion). Reading the
  // value under the log's lock orders concurrent writers of one key.
  absl::Status AppendKey(const std::string& job_id, std::int64_t round, const std::string& key,
                         const KvEngine& store) override;
  // Removes the job's file (the job was forgotten).
  void Forget(const std::string& job_id) override;

 private:
  explicit StateLog(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& job_id) const;

  const std::string dir_;  // <state_dir>/jobs
  std::mutex mu_;
};

}  // namespace ddprun::rendezvous
