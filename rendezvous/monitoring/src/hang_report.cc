#include "ddprun/rendezvous/monitoring/hang_report.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/errors.h"

namespace ddprun::rendezvous {
namespace {

constexpr std::size_t kMaxStacksShown = 8;

std::vector<int> Others(const std::vector<HangRank>& ranks, const std::vector<int>& culprits) {
  std::vector<int> out;
  for (const auto& r : ranks) {
    if (!std::binary_search(culprits.begin(), culprits.end(), r.rank)) out.push_back(r.rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", s);
  return buf;
}

std::string Describe(const HangRank& r) {
  std::string s = absl::StrCat("step ", r.steps);
  if (r.store == StoreReach::kNever) return s + ", never reached the store";
  if (r.store == StoreReach::kReached) return s + ", in the store";
  if (r.collective_seq > 0) {
    if (r.in_collective) {
      absl::StrAppend(&s, ", inside ", r.collective_op.empty() ? "collective" : r.collective_op,
                      " #", r.collective_seq);
    } else {
      absl::StrAppend(&s, ", not in a collective (", r.collective_seq, " started)");
    }
  }
  return s;
}

}  // namespace

std::string RankList(const std::vector<int>& sorted) {
  std::string out;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) absl::StrAppend(&out, "-", sorted[j]);
    i = j + 1;
  }
  return out;
}

HangVerdict FindHangCulprits(const std::vector<HangRank>& ranks) {
  HangVerdict v;
  if (ranks.empty()) return v;
  const bool sdk = std::any_of(ranks.begin(), ranks.end(),
                               [](const HangRank& r) { return r.collective_seq > 0; });
  auto pick = [&](auto key) {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = lo;
    hi = std::numeric_limits<std::int64_t>::min();
    for (const auto& r : ranks) {
      lo = std::min(lo, key(r));
      hi = std::max(hi, key(r));
    }
    std::vector<int> c;
    if (lo != hi) {
      for (const auto& r : ranks)
        if (key(r) == lo) c.push_back(r.rank);
    }
    return std::make_pair(lo, c);
  };
  if (sdk) {
    auto [lo, c] = pick([](const HangRank& r) { return r.collective_seq; });
    if (!c.empty()) {
      v.culprits = c;
      v.why = absl::StrCat("behind at collective #", lo, " while others started later ones");
    } else {
      const bool some_in = std::any_of(ranks.begin(), ranks.end(),
                                       [](const HangRank& r) { return r.in_collective; });
      if (some_in) {
        for (const auto& r : ranks)
          if (!r.in_collective) v.culprits.push_back(r.rank);
        if (!v.culprits.empty()) {
          v.why = absl::StrCat("not in collective #", lo, ", which the others are waiting in");
        }
      }
    }
  }
  if (v.culprits.empty()) {
    auto [lo, c] = pick([](const HangRank& r) { return r.steps; });
    if (!c.empty()) {
      v.culprits = c;
      v.why = absl::StrCat("behind at step ", lo, " while others are further");
    } else {
      for (const auto& r : ranks) v.culprits.push_back(r.rank);
      v.why = absl::StrCat("every rank stopped at step ", lo);
    }
  }
  std::sort(v.culprits.begin(), v.culprits.end());
  v.waiting = Others(ranks, v.culprits);
  return v;
}

HangVerdict FindStartupCulprits(const std::vector<HangRank>& ranks,
                                const std::vector<std::string>& store_waits) {
  HangVerdict v;
  for (const auto& r : ranks) {
    (r.store == StoreReach::kReached ? v.waiting : v.culprits).push_back(r.rank);
  }
  std::sort(v.culprits.begin(), v.culprits.end());
  std::sort(v.waiting.begin(), v.waiting.end());
  v.why = "never reached the round's store (MASTER_ADDR:MASTER_PORT, in init_process_group)";
  if (!v.waiting.empty()) {
    absl::StrAppend(&v.why, " while rank(s) ", RankList(v.waiting), " wait there");
  }
  if (!store_waits.empty()) {
    std::string keys;
    for (const std::string& k : store_waits) absl::StrAppend(&keys, keys.empty() ? "" : ", ", k);
    absl::StrAppend(&v.why, " for key(s) ", keys);
  }
  absl::StrAppend(&v.why,
                  "; a missing rank, a wrong world size, or a rank stuck before "
                  "init_process_group");
  return v;
}

// A Python frame of faulthandler's format ('  File "PATH", line N in F') whose
// path is inside torch's autograd or its distributed package.
bool InPyTorchCollective(const std::string& stack) {
  static constexpr const char* kWaitingIn[] = {"/torch/autograd/", "/torch/distributed/",
                                               "/torch/nn/parallel/distributed.py"};
  std::size_t pos = 0;
  while ((pos = stack.find("File \"", pos)) != std::string::npos) {
    pos += 6;
    const std::size_t end = stack.find('"', pos);
    if (end == std::string::npos) break;
    const std::string_view path(stack.data() + pos, end - pos);
    for (const char* w : kWaitingIn) {
      if (path.find(w) != std::string_view::npos) return true;
    }
    pos = end;
  }
  return false;
}

void RefineHangWithStacks(HangVerdict& verdict, const std::map<int, StackDump>& stacks) {
  if (!verdict.waiting.empty() || verdict.culprits.size() < 2) return;
  std::vector<int> behind, waiting;
  for (int r : verdict.culprits) {
    auto it = stacks.find(r);
    if (it == stacks.end() || it->second.kind != "python" || it->second.text.empty()) return;
    (InPyTorchCollective(it->second.text) ? waiting : behind).push_back(r);
  }
  if (behind.empty() || waiting.empty()) return;
  verdict.culprits = std::move(behind);
  verdict.waiting = std::move(waiting);
  absl::StrAppend(&verdict.why,
                  "; by their Python stacks, the others wait inside a PyTorch collective "
                  "(autograd or torch.distributed) and these do not");
}

std::string FormatHangReport(const HangReportInput& in) {
  std::map<int, const HangRank*> by_rank;
  for (const auto& r : in.ranks) by_rank[r.rank] = &r;
  std::string out = absl::StrCat(
      Fence(in.job_id, in.round),
      in.startup ? "HANG: no rank made a first step for " : "HANG: no rank made progress for ",
      Seconds(in.stalled_s), " s (--hang_timeout ", Seconds(in.hang_timeout_s),
      " s); culprit rank(s) ", RankList(in.verdict.culprits), ": ", in.verdict.why, "\n");
  std::size_t listed = 0;
  for (int c : in.verdict.culprits) {
    if (listed++ == kMaxStacksShown) {
      absl::StrAppend(&out, "  behind:  ... and ", in.verdict.culprits.size() - kMaxStacksShown,
                      " more\n");
      break;
    }
    const HangRank& r = *by_rank.at(c);
    absl::StrAppend(&out, "  behind:  rank ", r.rank, " on ", r.host, " pid ", r.pid, ", ",
                    Describe(r), "\n");
  }
  if (!in.verdict.waiting.empty()) {
    const HangRank& w = *by_rank.at(in.verdict.waiting.front());
    absl::StrAppend(&out, "  waiting: rank(s) ", RankList(in.verdict.waiting), " (rank ", w.rank,
                    " at ", Describe(w), ")\n");
  }
  std::size_t shown = 0;
  for (int c : in.verdict.culprits) {
    if (shown++ == kMaxStacksShown) {
      absl::StrAppend(&out, "  (stacks of the first ", kMaxStacksShown, " culprits only)\n");
      break;
    }
    const HangRank& r = *by_rank.at(c);
    auto s = in.stacks.find(c);
    if (s == in.stacks.end()) {
      absl::StrAppend(&out, "  stack of rank ", c, ": none (its agent sent no stack in time)\n");
      continue;
    }
    if (!s->second.error.empty() || s->second.text.empty()) {
      absl::StrAppend(&out, "  stack of rank ", c, ": none (",
                      s->second.error.empty() ? "empty" : s->second.error, ")\n");
      continue;
    }
    absl::StrAppend(&out, "  stack of rank ", c, " (", r.host, " pid ", r.pid, ", ",
                    s->second.kind.empty() ? "?" : s->second.kind, "):\n");
    std::size_t start = 0;
    const std::string& t = s->second.text;
    while (start < t.size()) {
      std::size_t end = t.find('\n', start);
      if (end == std::string::npos) end = t.size();
      absl::StrAppend(&out, "    ", t.substr(start, end - start), "\n");
      start = end + 1;
    }
  }
  if (in.on_hang == "restart") {
    absl::StrAppend(&out,
                    "  on_hang=restart: the round restarts; this counts as a failure "
                    "against --max_restarts\n");
  } else if (in.on_hang == "abort") {
    absl::StrAppend(&out, "  on_hang=abort: the job is closed as failed\n");
  } else {
    absl::StrAppend(&out,
                    "  on_hang=report: nothing is stopped; the report repeats if progress "
                    "resumes and stops again\n");
  }
  return out;
}

}  // namespace ddprun::rendezvous
