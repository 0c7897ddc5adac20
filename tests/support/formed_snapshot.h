// The snapshot a JobTable persists when a round forms, without etcd, streams
// or sockets: N joins into an in-process JobTable whose journal keeps the last
// snapshot written. Shared by bench/etcd_snapshot_size (sizes) and the HA
// size tests (a large job's snapshot written through the etcd journal).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/rendezvous/job_journal.h"
#include "ddprun/rendezvous/job_table.h"

namespace ddprun::testing {

// A JobJournal that keeps the last snapshot written and nothing else.
class LastSnapshotJournal final : public rendezvous::JobJournal {
 public:
  absl::StatusOr<std::vector<rendezvous::RecoveredJob>> Recover() override {
    return std::vector<rendezvous::RecoveredJob>{};
  }
  absl::Status WriteSnapshot(const rendezvous::JobSnapshot& snap, std::int64_t,
                             const rendezvous::KvEngine&) override {
    last = snap;
    return absl::OkStatus();
  }
  absl::Status AppendKey(const std::string&, std::int64_t, const std::string&,
                         const rendezvous::KvEngine&) override {
    return absl::OkStatus();
  }
  void Forget(const std::string&) override {}

  rendezvous::JobSnapshot last;
};

// An agent's stream that nobody reads.
class NullSink final : public rendezvous::EventSink {
 public:
  void Bind(const std::string&, const std::string&) override {}
  void Deliver(rendezvous::RoundEvent) override {}
};

// Joins every spec (one job, min = max = specs.size() nodes) and returns the
// snapshot persisted when the round formed. InvalidArgument naming the join
// that was refused; Internal when the round did not form with every member.
inline absl::StatusOr<rendezvous::JobSnapshot> FormedSnapshot(
    const std::vector<rendezvous::JoinSpec>& specs) {
  LastSnapshotJournal journal;
  rendezvous::JobTableOptions o;
  o.journal = &journal;
  rendezvous::JobTable table(std::move(o));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<std::string> id = table.Join(specs[i], std::make_shared<NullSink>());
    if (!id.ok()) {
      return absl::InvalidArgumentError("join " + std::to_string(i) +
                                        " refused: " + std::string(id.status().message()));
    }
  }
  if (journal.last.members.size() != specs.size()) {
    return absl::InternalError("the round did not form with " + std::to_string(specs.size()) +
                               " members");
  }
  return journal.last;
}

}  // namespace ddprun::testing
