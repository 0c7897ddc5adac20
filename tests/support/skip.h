// The one skip convention of the test tiers (see the top of tests/CMakeLists.txt).
//
// A case that cannot run here (no torch, no numpy, no CUDA device, no network
// namespaces) calls SkipCase(tier, why) and returns:
//
//   if (!TorchAvailable()) return SkipCase("e2e", "python3 cannot import torch");
//
// It prints "SKIPPED [<tier>]: <why>" (a Catch2 warning) and marks the case
// skipped. At the end of the run, when every case that ran was skipped and no
// assertion failed, the program prints one line
//
//   ALL SKIPPED [<program>]: <n> case(s) skipped, none ran
//
// (tests/support/catch_main.cc), which the CTest test's
// SKIP_REGULAR_EXPRESSION matches: CTest shows it as Skipped. A program where
// one case ran, or anything failed, never prints it, so a skip cannot hide a
// failure; CTest tests that mix cases with and without a dependency are
// split by tag instead (tests/CMakeLists.txt).
#pragma once

#include <catch2/catch.hpp>
#include <string>

namespace ddprun::test {

// Whether the running case called SkipCase (reset when a case starts).
bool& CurrentCaseSkipped();

inline void SkipCase(const std::string& tier, const std::string& why) {
  WARN("SKIPPED [" << tier << "]: " << why);
  CurrentCaseSkipped() = true;
}

}  // namespace ddprun::test
