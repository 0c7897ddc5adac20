// `ddprun bench --scaling` across nodes (docs/bench.md "Across nodes").
//
// Protocol. Every node runs the same command. The launcher starts a first job
// of all the nodes, "scaling.<id>", with one worker per node: this binary's
// hidden subcommand kBenchScalingNodeSubcommand (bench_command.h). That round
// gives each node its stable rank r (GROUP_RANK) and the node count K, and
// group rank 0's TCPStore (MASTER_ADDR:MASTER_PORT) is the nodes' meeting
// point until the end. The world sizes are ScalingWorldsAcrossNodes(P, K).
// For world size number i, of w ranks on n = ceil(w / P) nodes (nodes 0..n-1,
// P ranks each, or w ranks on node 0 when w <= P), under the store prefix
// "ddprun-bench-scaling/<i>/":
//   node 0     picks a free port, sets "port"; runs its part of the job;
//   nodes < n  read "port", run their part: a static-rendezvous job
//              "<id>.scaling<w>" of n nodes (node rank r, master MASTER_ADDR
//              and that port); set "done/<r>" to its exit code;
//   node 0     reads its summary (the row), waits for every "done/<j>", sets
//              "next" to "0" or "<exit code> <one line>"; prints the row;
//   nodes > 0  wait for "next" and stop with that code when it is not 0.
// Every wait has a deadline (bench_scaling_nodes.cc); a node that dies ends
// the first job's round, so every other node's agent stops its node worker and
// exits with the agent's one-line failure.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ddprun/agent/agent_options.h"
#include "ddprun/launcher/cli.h"

namespace ddprun::launcher::bench {

// The launcher's side: runs the first job with `options` (the user's job,
// parsed) and returns this node's exit code.
int RunScalingAcrossNodes(const std::vector<std::string>& launcher_args, const std::string& worker,
                          const std::vector<std::string>& worker_args, agent::AgentOptions options,
                          std::ostream& err);

}  // namespace ddprun::launcher::bench
