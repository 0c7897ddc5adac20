// What the job table tells an observer (the metrics hub) about its jobs: the
// rounds, joins, losses, restarts, failures and the end of each job, as they
// happen. The table calls it under its own lock, in the order of the
// changes, so an observer must not call back into the table from
// OnJobChange.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/types.h"

namespace ddprun::rendezvous {

struct JobChange {
  enum class Kind {
    kEvent,         // something to put on the job's timeline (text)
    kRoundStarted,  // a round is running: nodes, node_ids, world_size, shape
    kRestart,       // the running round ended; text is the reason
    kClosed,        // the job ended: success, text (the reason), failures
    kForgotten,     // the table forgot the closed job
  };
  Kind kind = Kind::kEvent;
  std::string job_id;
  std::int64_t round = 0;
  std::string text;
  std::string tag;  // kEvent: "join", "lost", "failure", "leave"
  // kRoundStarted
  std::vector<NodeInfo> nodes;        // by group rank
  std::vector<std::string> node_ids;  // by group rank
  int world_size = 0;
  int restart_count = 0;
  JobPolicy policy;  // the job's (the first joiner's)
  // kRestart
  bool counts_as_failure = false;
  // kClosed
  bool success = false;
  std::vector<WorkerFailure> failures;  // first failure first
};

class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void OnJobChange(const JobChange& change) = 0;
};

}  // namespace ddprun::rendezvous
