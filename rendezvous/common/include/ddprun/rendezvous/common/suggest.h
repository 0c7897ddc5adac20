// The one "did you mean" of every command: ddprun's flags and subcommand
// names, the flags of bench, check, status and top, ddprund's flags, and the
// job file's keys all suggest through ClosestMatch, so a typo gets the same
// answer everywhere.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rendezvous {

// Levenshtein distance (insertions, deletions, substitutions).
std::size_t EditDistance(std::string_view a, std::string_view b);

// The word of `known` closest to `word` when it is close enough to be a typo
// of it (distance below max(3, size/3 + 1); the first of equals wins), else
// the first that holds `word` (3 characters or more) as an abbreviation, its
// characters in order ("rdzv" -> "rendezvous"); "" when none does.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& known);

// " (did you mean X?)" for X = ClosestMatch(word, known) written as
// `quote` X `quote`, or "" without a match.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& known,
                       std::string_view quote = "");

}  // namespace ddprun::rendezvous
