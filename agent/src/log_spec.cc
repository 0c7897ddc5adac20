#include "ddprun/agent/log_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddprun::agent {
namespace {

std::optional<int> SmallInt(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  int v = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &v)) return std::nullopt;
  return v;
}

}  // namespace

int StdStreams::ForLocalRank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? 0 : it->second;
}

bool StdStreams::Any() const {
  if (all != 0) return true;
  return std::any_of(per_rank.begin(), per_rank.end(), [](const auto& kv) { return kv.second; });
}

absl::StatusOr<StdStreams> ParseStdStreams(absl::string_view value) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-local-rank map like "
        "0:3,1:2; got '",
        value, "'"));
  };
  StdStreams out;
  if (value.find(':') == absl::string_view::npos) {
    auto v = SmallInt(value);
    if (!v || *v < 0 || *v > 3) return bad();
    out.all = *v;
    return out;
  }
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits(':', 1));
    auto rank = SmallInt(kv.first);
    auto v = SmallInt(kv.second);
    if (!rank || !v || *rank < 0 || *v < 0 || *v > 3) return bad();
    out.per_rank[*rank] = *v;
  }
  return out;
}

bool LogSpec::ShowsOnConsole(int local_rank) const {
  return local_ranks_filter.empty() ||
         std::find(local_ranks_filter.begin(), local_ranks_filter.end(), local_rank) !=
             local_ranks_filter.end();
}

StreamPlan PlanStream(const LogSpec& spec, int local_rank, StdStream stream) {
  const int bit = static_cast<int>(stream);
  const bool redirect = (spec.redirects.ForLocalRank(local_rank) & bit) != 0;
  const bool tee = (spec.tee.ForLocalRank(local_rank) & bit) != 0;
  StreamPlan p;
  p.file = redirect || tee;
  // -r alone keeps a stream off the console; -t (which implies -r) shows it.
  p.console = (tee || !redirect) && spec.ShowsOnConsole(local_rank);
  p.prefix = p.console && (tee || spec.prefix_output);
  if (stream == StdStream::kStderr) p.tail_lines = std::max(0, spec.stderr_tail_lines);
  return p;
}

std::string LinePrefix(const std::string& tmpl, const std::string& host, const std::string& role,
                       int rank, int local_rank) {
  const std::string& t = tmpl.empty() ? std::string(kDefaultPrefixTemplate) : tmpl;
  auto value = [&](absl::string_view name) -> std::optional<std::string> {
    if (name == "role_name") return role;
    if (name == "rank") return std::to_string(rank);
    if (name == "local_rank") return std::to_string(local_rank);
    if (name == "hostname" || name == "host") return host;
    return std::nullopt;
  };
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (std::size_t i = 0; i < t.size();) {
    if (t[i] != '$' || i + 1 >= t.size()) {
      out.push_back(t[i++]);
      continue;
    }
    if (t[i + 1] == '$') {  // $$ is one '$'
      out.push_back('$');
      i += 2;
      continue;
    }
    std::size_t begin = i + 1, end = begin;
    const bool braced = t[begin] == '{';
    if (braced) {
      end = t.find('}', begin);
      if (end == std::string::npos) {
        out.append(t, i, std::string::npos);
        break;
      }
      ++begin;
    } else {
      // Python identifiers: a letter or '_' first.
      if (!std::isalpha(static_cast<unsigned char>(t[begin])) && t[begin] != '_') {
        out.push_back(t[i++]);
        continue;
      }
      while (end < t.size() && ident(t[end])) ++end;
    }
    const std::optional<std::string> v = value(absl::string_view(t).substr(begin, end - begin));
    const std::size_t next = braced ? end + 1 : end;
    if (v) {
      out += *v;
    } else {
      out.append(t, i, next - i);  // unknown: kept as written
    }
    i = next;
  }
  return out;
}

}  // namespace ddprun::agent
