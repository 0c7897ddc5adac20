// Where a knob's value goes: a typed field of ParsedCommand, named in the
// knob's row of the table (knobs.h, Knob::dest) as a path of members, so
// that resolution stores it (ApplyKnobDests, knob_apply.h) without naming
// the knob. A knob without a destination is resolved by hand in
// resolve_options.cc because its value spans several knobs or fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ddprun/agent/agent_options.h"
#include "ddprun/agent/log_spec.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/rendezvous/common/job_policy.h"

namespace ddprun::launcher {

// A field of the resolved command, by reference.
template <class T>
using FieldOf = T& (*)(ParsedCommand&);

// The field at the end of a path of pointers to members:
// FieldAt<&ParsedCommand::options, &agent::AgentOptions::role>.
template <auto... Path>
auto& FieldAt(ParsedCommand& c) {
  return (c.*....*Path);
}

// What a knob's row may name. The value type of the row (Knob::type) must
// fit the field: a count goes to an int, seconds to a double or a duration,
// bytes to a std::uint64_t (knobs_test checks every row).
using KnobDest =
    std::variant<std::monostate, FieldOf<int>, FieldOf<double>, FieldOf<bool>, FieldOf<std::string>,
                 FieldOf<rendezvous::OnHang>, FieldOf<rendezvous::RestartPolicy>,
                 FieldOf<agent::StdStreams>, FieldOf<std::vector<int>>,
                 FieldOf<std::chrono::duration<double>>, FieldOf<std::uint64_t>>;

// Shorthands for the table's rows.
template <auto... Path>
inline constexpr auto kInOptions = &FieldAt<&ParsedCommand::options, Path...>;
template <auto... Path>
inline constexpr auto kInPolicy =
    &FieldAt<&ParsedCommand::options, &agent::AgentOptions::policy, Path...>;
template <auto... Path>
inline constexpr auto kInLogs =
    &FieldAt<&ParsedCommand::options, &agent::AgentOptions::logs, Path...>;
template <auto... Path>
inline constexpr auto kInLauncher = &FieldAt<&ParsedCommand::launcher, Path...>;

}  // namespace ddprun::launcher
