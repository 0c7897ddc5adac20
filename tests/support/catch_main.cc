// The main() of every Catch2 program of the tests, with the listener behind
// the skip convention (support/skip.h).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <cerrno>
#include <iostream>

#include "support/skip.h"

namespace ddprun::test {

bool& CurrentCaseSkipped() {
  static bool skipped = false;
  return skipped;
}

namespace {

// Counts the cases that skipped and those that ran; prints "ALL SKIPPED
// [<program>]" at the end only when none ran and nothing failed.
class SkipSummary : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    CurrentCaseSkipped() = false;
    TestEventListenerBase::testCaseStarting(info);
  }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    if (CurrentCaseSkipped() && stats.totals.assertions.failed == 0) {
      ++skipped_;
    } else {
      ++ran_;
    }
    TestEventListenerBase::testCaseEnded(stats);
  }
  void testRunEnded(Catch::TestRunStats const& stats) override {
    TestEventListenerBase::testRunEnded(stats);
    if (skipped_ > 0 && ran_ == 0 && stats.totals.assertions.failed == 0) {
      std::cout << "ALL SKIPPED [" << program_invocation_short_name << "]: " << skipped_
                << " case(s) skipped, none ran" << std::endl;
    }
  }

 private:
  int skipped_ = 0;
  int ran_ = 0;
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipSummary)

}  // namespace ddprun::test
