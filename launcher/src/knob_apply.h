// Stores each knob whose row names a destination (knobs.h, Knob::dest):
// its merged value (flag_table.h), checked by the parser of its type
// (value_parsers.h), goes to its field of ParsedCommand. A bad value is a
// usage error naming where it came from, as ParseKnob's.
#pragma once

#include "absl/status/status.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/knobs.h"
#include "flag_table.h"

namespace ddprun::launcher {

// Every flag of kKnobs with a destination, in the table's order; the first
// bad value ends it. A knob without a value and without a default keeps its
// field as it is.
absl::Status ApplyKnobDests(const FlagTable& flags, ParsedCommand& out);

// One value of a knob with a destination (a key of --rdzv_conf, say):
// parsed as the row's type and stored. InternalError for a row without a
// destination, or whose destination does not hold its type.
absl::Status ApplyKnobValue(const Knob& knob, const KnobValue& value, ParsedCommand& out);

}  // namespace ddprun::launcher
