// The debug channel: DDPRUN_DEBUG=rdzv,agent,store,sdk (or "all") turns on
// one line per event on stderr for those subsystems, "[ddprun:<sub> pid]
// message". Off, a DDPRUN_DEBUG_LOG statement costs one load and a branch:
// the message is not formatted.
//
//   DDPRUN_DEBUG_LOG(kAgent) << "spawned " << n << " workers";
#pragma once

#include <atomic>
#include <sstream>

namespace ddprun::debug {

enum Subsystem : unsigned { kRdzv = 1u << 0, kAgent = 1u << 1, kStore = 1u << 2, kSdk = 1u << 3 };

// The enabled set, read from DDPRUN_DEBUG on first use; tests may set it.
unsigned Enabled();
void SetEnabledForTest(unsigned mask);
// Parses "rdzv,agent" / "all" / "" ; unknown names are ignored.
unsigned ParseSubsystems(const char* text);
// The channels a process starts with: DDPRUN_DEBUG's when it is set, else
// torchrun's LOGLEVEL=DEBUG (any case) turns on the launcher's own channels
// (rdzv, agent, store; not the workers' sdk), as it turns on torchrun's
// elastic agent log; any other LOGLEVEL, none.
unsigned InitialMask(const char* ddprun_debug, const char* loglevel);
const char* SubsystemName(Subsystem s);

// One line, written with a single write(2) when destroyed.
class Line {
 public:
  explicit Line(Subsystem s);
  ~Line();
  template <class T>
  Line& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  std::ostringstream out_;
};

struct Voidify {
  void operator&(const Line&) {}
};

}  // namespace ddprun::debug

#define DDPRUN_DEBUG_LOG(sub)                                   \
  !(::ddprun::debug::Enabled() & ::ddprun::debug::sub) ? (void)0 \
                                                        : ::ddprun::debug::Voidify() & ::ddprun::debug::Line(::ddprun::debug::sub)
