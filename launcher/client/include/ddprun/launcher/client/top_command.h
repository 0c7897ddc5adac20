// `ddprun top --rdzv_endpoint HOST[:PORT] [--job ID] [--once]`: one row per
// rank of a running job (state, steps, step time p50/p90, steps/s,
// samples/s, CPU, memory, GPU, straggler), the job's samples/s and step time,
// and its hang report, refreshed every second from GetMetrics (the same
// document as the dashboard's). main() sends argv here when argv[1] is "top".
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ddprun::launcher {

// Renders one GetMetrics document (docs/monitoring.md) as text; a document
// that does not parse is a one-line error text.
std::string FormatTop(const std::string& job_json);

// args[0] is the program, args[1] "top". Returns the exit code: 0, 2 usage
// error, 3 the endpoint did not answer or the job is unknown.
int RunTopCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace ddprun::launcher
