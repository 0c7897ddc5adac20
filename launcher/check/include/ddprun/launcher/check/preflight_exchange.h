// The protocol of `ddprun check`'s workers (one per node) over the job's
// store, keys under "ddprun.check/" of the round:
//
//  1. Arrive. Each node opens a TCP listener and sets listen/<g> =
//     "<advertised host> <port>"; then every node reads every listen/<r>
//     (bounded by the check timeout). A node absent by then is "missing".
//  2. Clocks. Node g != 0 sets ping/<g>/<i> and waits for pong/<g>/<i>,
//     which node 0 sets to its wall clock as soon as it sees the ping
//     (nodes in ascending order, kClockSamples each). Offset = t1 - (t0 +
//     t2) / 2 of the sample with the shortest round trip; uncertainty half
//     that round trip.
//  3. Reach. Each node resolves every name it needs and connects to the
//     rendezvous, the store and every other node's listener, the connections
//     in parallel, each with the connect deadline.
//  4. Facts. Each node sets facts/<g> (preflight.h FactsToJson).
//  5. Verdict. Node 0 reads every facts/<r> (a node with none by the
//     deadline is reported as such), runs the checks and sets verdict =
//     {"exit_code", "summary"}; the others read it, set ack/<g>, and node 0
//     waits (bounded) for the acks before it returns, so that its store
//     outlives their reads.
//
// Every wait is bounded; a store error ends this node's part with the
// error, never a hang.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddprun/launcher/check/preflight.h"
#include "ddprun/launcher/check/preflight_probe.h"
#include "ddprun/rendezvous/store/store.h"

namespace ddprun::launcher::preflight {

inline constexpr int kClockSamples = 5;
inline constexpr const char* kKeyPrefix = "ddprun.check/";

// A TCP endpoint a node must reach: "rendezvous", "store".
struct Target {
  std::string what;
  std::string host;
  int port = 0;
};

struct ExchangeInput {
  int group_rank = 0;
  int group_world_size = 1;
  std::string host;             // this node's advertised address
  std::vector<Target> targets;  // besides the other nodes
  JobFacts job;
  Millis timeout{30000};         // arrival and results
  Millis connect_timeout{5000};  // one TCP connection
};

struct ExchangeOutcome {
  int exit_code = 0;
  std::string text;  // node 0: the table; others: one summary line
  std::string json;  // node 0: the report as JSON; others: {"node", "host", "summary",
                     // "exit_code", "report_on_node": 0}
};

// Runs this node's part. `collect_local` gathers this node's own facts
// (CollectLocalFacts); it runs after step 2, so that the slow probes (the
// Python interpreter) run on every node at once, within node 0's wait for
// facts, and do not disturb the clock samples.
absl::StatusOr<ExchangeOutcome> RunExchange(rendezvous::Store& store, SystemProbe& probe,
                                            const std::function<NodeFacts()>& collect_local,
                                            const ExchangeInput& in);

}  // namespace ddprun::launcher::preflight
