// Who hangs, and the one report that says so (docs/monitoring.md, "The hang
// report"). Pure functions, used by the metrics hub.
//
// Culprits: for SDK trainers (a rank with collective_seq > 0) the ranks with
// the lowest collective number when the numbers differ, or, when every rank
// is at the same number, the ranks that are not inside that collective while
// others are. Otherwise the ranks with the lowest step count; when every
// rank is at the same step and the collectives say nothing, every rank is a
// culprit ("all ranks stopped at step N"). The others are the waiting ranks.
// Before any rank's first step (FindStartupCulprits): the ranks that never
// reached the round's store are the culprits, those in it wait for them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::rendezvous {

// Whether a rank reached its round's store (known for a startup hang only).
enum class StoreReach { kUnknown, kReached, kNever };

struct HangRank {
  int rank = -1;
  std::string host;
  std::int64_t pid = 0;
  std::int64_t steps = 0;
  std::int64_t collective_seq = 0;
  bool in_collective = false;
  std::string collective_op;
  StoreReach store = StoreReach::kUnknown;
};

struct HangVerdict {
  std::vector<int> culprits;  // ascending
  std::vector<int> waiting;   // ascending
  std::string why;            // "lowest collective number 812", ...
};

HangVerdict FindHangCulprits(const std::vector<HangRank>& ranks);

// A round stuck before its first step: culprits are the ranks with
// StoreReach::kNever, the others wait; `store_waits` are the keys waited for
// in the store (from its host), named in `why`.
HangVerdict FindStartupCulprits(const std::vector<HangRank>& ranks,
                                const std::vector<std::string>& store_waits);

// When the counters cannot tell (every rank stopped at the same step: an
// unmodified PyTorch script, whose ranks all wait for step N's all-reduce
// while one never reaches it), the Python stacks can: a rank whose stack has
// a frame in torch's autograd or torch.distributed (DDP's backward, a c10d
// call) waits in a collective; the ranks without one are the culprits. The
// verdict changes only when the stacks split the ranks into both groups, and
// only on "python" stacks of every culprit; otherwise it stays as it is.
void RefineHangWithStacks(HangVerdict& verdict, const std::map<int, StackDump>& stacks);

// Whether a Python stack (faulthandler's format) has a frame inside torch's
// autograd or its distributed package: the rank waits in a collective. The
// one rule of RefineHangWithStacks, also used by the agent's in-place
// restart to tell a stuck worker from the ones waiting for it.
bool InPyTorchCollective(const std::string& stack);

// "0-3,5,7-8" for sorted ranks.
std::string RankList(const std::vector<int>& sorted_ranks);

struct HangReportInput {
  std::string job_id;
  std::int64_t round = 0;
  double stalled_s = 0;
  double hang_timeout_s = 0;
  std::string on_hang;   // "report" | "restart" | "abort"
  bool startup = false;  // before the first step (FindStartupCulprits)
  std::vector<HangRank> ranks;
  HangVerdict verdict;
  std::map<int, StackDump> stacks;  // by rank; culprits without one say why
};

// The report, several lines, fenced by job and round on its first line.
std::string FormatHangReport(const HangReportInput& in);

}  // namespace ddprun::rendezvous
