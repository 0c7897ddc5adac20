// `ddprun status --rdzv_endpoint HOST[:PORT] [--rdzv_id ID] [--json]`: lists
// the jobs a ddprund (or an agent hosting the rendezvous) serves: each job's
// round, state, nodes, ranks, world size and restarts. main() sends argv here
// when argv[1] is "status"; the training-script command line is unchanged (a
// script named "status" runs as ./status or after --).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/types.h"

namespace ddprun::launcher {

// Renders the jobs as a table (one header, one line per job, one indented
// line per node) or as JSON ({"endpoint": ..., "jobs": [...]}).
std::string FormatStatusText(const std::vector<rendezvous::JobStatus>& jobs);
std::string FormatStatusJson(const std::string& endpoint,
                             const std::vector<rendezvous::JobStatus>& jobs);

// Runs the subcommand; args[0] is the program, args[1] "status". Returns the
// exit code: 0, 2 usage error, 3 the endpoint did not answer.
int RunStatusCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace ddprun::launcher
