#include "knob_apply.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "ddprun/launcher/value_parsers.h"

namespace ddprun::launcher {
namespace {

// How a parsed value fits a field: the same type, a count into an int (the
// row's bounds keep it in range), seconds into a double.
template <class Field, class Value>
bool Fit(Field& field, Value&& value) {
  using V = std::decay_t<Value>;
  if constexpr (std::is_same_v<Field, V>) {
    field = std::forward<Value>(value);
    return true;
  } else if constexpr (std::is_same_v<Field, int> && std::is_same_v<V, long>) {
    field = static_cast<int>(value);
    return true;
  } else if constexpr (std::is_same_v<Field, double> && std::is_same_v<V, Seconds>) {
    field = value.count();
    return true;
  } else {
    return false;
  }
}

template <class Value>
absl::Status Store(const Knob& knob, ParsedCommand& out, Value&& value) {
  bool stored = false;
  std::visit(
      [&](auto field) {
        if constexpr (!std::is_same_v<decltype(field), std::monostate>) {
          stored = Fit(field(out), std::forward<Value>(value));
        }
      },
      knob.dest);
  if (stored) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("knob ", knob.Dest(), ": its destination does not hold its value type"));
}

// The row's parser applied to v; a failure names where v came from.
template <class Parsed>
absl::Status Put(const Knob& knob, const KnobValue& v, ParsedCommand& out, Parsed parsed) {
  if (!parsed.ok()) return BadValue(v, knob, parsed.status());
  return Store(knob, out, *std::move(parsed));
}

}  // namespace

absl::Status ApplyKnobValue(const Knob& knob, const KnobValue& v, ParsedCommand& out) {
  const std::string& text = v.value;
  switch (knob.type) {
    case ValueType::kSeconds:
    case ValueType::kPositiveSeconds:
      return Put(knob, v, out, ParseSeconds(text, knob.type == ValueType::kSeconds));
    case ValueType::kCount:
      return Put(knob, v, out, ParseCount(text, knob.min, knob.max, knob.what));
    case ValueType::kPort:
      return Put(knob, v, out, ParsePort(text));
    case ValueType::kPortOrOff:
      return Put(knob, v, out, ParsePortOrOff(text));
    case ValueType::kText:
      return Put(knob, v, out, ParseText(text));
    case ValueType::kToken:
      return Put(knob, v, out, ParseToken(text));
    case ValueType::kStartMethod:
      return Put(knob, v, out, ParseStartMethod(text));
    case ValueType::kOnHang:
      return Put(knob, v, out, ParseOnHang(text));
    case ValueType::kRestartPolicy:
      return Put(knob, v, out, ParseRestartPolicy(text));
    case ValueType::kStreams:
      return Put(knob, v, out, ParseStreams(text));
    case ValueType::kRankList:
      return Put(knob, v, out, ParseRankList(text));
    case ValueType::kBytes:
      return Put(knob, v, out, ParseBytes(text));
    default:
      break;
  }
  return absl::InternalError(
      absl::StrCat("knob ", knob.Dest(), ": no destination for a value of its type"));
}

absl::Status ApplyKnobDests(const FlagTable& flags, ParsedCommand& out) {
  for (const Knob& knob : kKnobs) {
    if (!knob.is_flag() || std::holds_alternative<std::monostate>(knob.dest)) continue;
    if (knob.type == ValueType::kBool) {
      absl::StatusOr<bool> on = flags.GetBool(knob.name);
      if (!on.ok()) return on.status();
      if (absl::Status st = Store(knob, out, *on); !st.ok()) return st;
      continue;
    }
    const KnobValue v = flags.Get(knob.Dest());
    if (!v.is_set() && knob.default_value == nullptr) continue;
    if (absl::Status st = ApplyKnobValue(knob, v, out); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace ddprun::launcher
