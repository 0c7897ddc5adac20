#include "ddprun/rendezvous/common/suggest.h"

#include <algorithm>

namespace ddprun::rendezvous {

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(3, word.size() / 3 + 1);
  for (const std::string& k : known) {
    const std::size_t d = EditDistance(word, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  if (!best.empty() || word.size() < 3) return best;
  // An abbreviation: `word` in order within a longer known word ("rdzv" in
  // "rendezvous", "nproc" in "nproc_per_node").
  for (const std::string& k : known) {
    std::size_t at = 0;
    for (char c : k) {
      if (at < word.size() && c == word[at]) ++at;
    }
    if (at == word.size()) return k;
  }
  return best;
}

std::string DidYouMean(std::string_view word, const std::vector<std::string>& known,
                       std::string_view quote) {
  const std::string best = ClosestMatch(word, known);
  if (best.empty()) return "";
  std::string out = " (did you mean ";
  out.append(quote).append(best).append(quote).append("?)");
  return out;
}

}  // namespace ddprun::rendezvous
