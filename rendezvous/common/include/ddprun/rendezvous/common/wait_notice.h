// A wait that tells the user about itself (docs/cli.md, "Waits"): a wait that
// lasts kWaitNoticeFirst prints one line saying what it waits for, how far it
// got (how many have joined) and until when, then a reminder every
// kWaitNoticeEvery, until it ends. Every wait of a node before its workers
// start uses it: the first node of a multi-node job waiting for the others,
// an elastic job at its minimum waiting last_call_timeout, a static node
// waiting for node rank 0, `ddprun check` waiting for the other nodes.
//
// No thread and no sleep of its own: the waiting loop calls Poll() whenever
// it wakes and wakes no later than due(). The clock is injected, so a unit
// test drives it with a FakeClock.
#pragma once

#include <functional>
#include <string>

#include "ddprun/rendezvous/common/clock.h"

namespace ddprun::rendezvous {

inline constexpr Duration kWaitNoticeFirst = std::chrono::seconds(5);
inline constexpr Duration kWaitNoticeEvery = std::chrono::seconds(60);

// What a wait is at the moment its line is due.
struct WaitState {
  std::string what;      // "waiting for the other nodes of this job (--nnodes=2)"
  std::string progress;  // "1 of 2 nodes have joined"; may be empty
  TimePoint until{};     // when the wait ends
  std::string then;      // what happens then: "exit 3 (--rdzv_conf join_timeout)"
};

// The one line of a WaitState at `now`: "WHAT: PROGRESS; until HH:MM:SS (in
// N s), then THEN".
std::string FormatWaitLine(const WaitState& state, TimePoint now);

class WaitNotice {
 public:
  // `describe` is asked only when a line is due (it may ask a server);
  // `emit` prints the line.
  WaitNotice(const Clock& clock, std::function<WaitState()> describe,
             std::function<void(const std::string&)> emit);

  // Prints the line if it is due; true when it printed.
  bool Poll();
  // When the next line is due.
  TimePoint due() const { return due_; }
  int lines() const { return lines_; }

 private:
  const Clock& clock_;
  std::function<WaitState()> describe_;
  std::function<void(const std::string&)> emit_;
  TimePoint due_;
  int lines_ = 0;
};

}  // namespace ddprun::rendezvous
