// `ddprun completion bash|zsh`: a shell completion script generated from the
// knob table (every flag in both spellings, the fixed choices of its value)
// and the subcommands, so that it cannot fall behind either.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::launcher {

inline constexpr const char* kCompletionSubcommand = "completion";
// torchrun's spelling of the same (`torchrun --print-completion bash`): the
// script for that shell, then exit 0 (cli.cc).
inline constexpr const char* kPrintCompletionFlag = "--print-completion";

// The subcommands a user types (the hidden `_...` workers are left out).
inline constexpr const char* kUserSubcommands[] = {"status", "top", "check", "bench",
                                                   kCompletionSubcommand};

// The completion script for `shell` ("bash" or "zsh"); InvalidArgument naming
// the shells otherwise.
absl::StatusOr<std::string> CompletionScript(std::string_view shell);

// main() for `ddprun completion SHELL` (args as main's argv): the script on
// `out`, exit 0; a usage error on `err`, exit 2.
int RunCompletionCommand(const std::vector<std::string>& args, std::ostream& out,
                         std::ostream& err);

}  // namespace ddprun::launcher
