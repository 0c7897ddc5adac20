// Defaults written once, as text: a knob's default is a string constant that
// --help, --print-config and the docs show (launcher/knobs.h), and the typed
// value a struct starts from is parsed from that same constant at compile
// time, so a default has one place (issue 25: "grep finds each default once").
#pragma once

#include <string_view>

namespace ddprun::rendezvous {

// A default's text as a number: digits with an optional fraction. Only for
// such constants (evaluated at compile time; bad text does not compile).
consteval double DefaultNumber(std::string_view text) {
  double value = 0, scale = 0;
  for (char c : text) {
    if (c == '.' && scale == 0) {
      scale = 1;
    } else if (c >= '0' && c <= '9') {
      value = value * 10 + (c - '0');
      scale *= 10;
    } else {
      throw "a default must be a plain number";
    }
  }
  return scale > 1 ? value / scale : value;
}

}  // namespace ddprun::rendezvous
