// Lookups over the knob table (knobs.h).
#include "ddprun/launcher/knobs.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::launcher {

std::string Knob::Dest() const {
  return name != nullptr ? std::string(name) : absl::StrCat("rdzv_conf.", rdzv_conf);
}

const Knob* FindKnob(absl::string_view name) {
  for (const Knob& k : kKnobs) {
    if (k.name != nullptr && name == k.name) return &k;
  }
  return nullptr;
}

const Knob* FindRdzvConfKnob(absl::string_view key) {
  for (const Knob& k : kKnobs) {
    if (k.rdzv_conf != nullptr && key == k.rdzv_conf) return &k;
  }
  return nullptr;
}

const Knob* FindYamlKnob(absl::string_view yaml_key) {
  for (const Knob& k : kKnobs) {
    if (k.yaml_key != nullptr && yaml_key == k.yaml_key) return &k;
  }
  return nullptr;
}

const Knob& KnobNamed(absl::string_view name) {
  const Knob* k = FindKnob(name);
  DDPRUN_CHECK(k != nullptr) << "no knob named " << name;
  return *k;
}

std::string PetName(absl::string_view flag_name) {
  return absl::StrCat("PET_", absl::AsciiStrToUpper(flag_name));
}

std::string DashName(absl::string_view flag_name) {
  std::string dashed(flag_name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  return dashed;
}

}  // namespace ddprun::launcher
