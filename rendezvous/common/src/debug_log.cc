#include "ddprun/rendezvous/common/debug_log.h"

#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::debug {
namespace {

constexpr unsigned kUnread = ~0u;
std::atomic<unsigned> g_mask{kUnread};

}  // namespace

unsigned ParseSubsystems(const char* text) {
  if (text == nullptr) return 0;
  unsigned mask = 0;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (name == "all" || name == "1") mask |= kRdzv | kAgent | kStore | kSdk;
    if (name == "rdzv") mask |= kRdzv;
    if (name == "agent") mask |= kAgent;
    if (name == "store") mask |= kStore;
    if (name == "sdk") mask |= kSdk;
  }
  return mask;
}

unsigned InitialMask(const char* ddprun_debug, const char* loglevel) {
  if (ddprun_debug != nullptr) return ParseSubsystems(ddprun_debug);
  if (loglevel != nullptr && ::strcasecmp(loglevel, "DEBUG") == 0) return kRdzv | kAgent | kStore;
  return 0;
}

unsigned Enabled() {
  unsigned m = g_mask.load(std::memory_order_relaxed);
  if (m == kUnread) {
    m = InitialMask(std::getenv(kEnvDebug), std::getenv("LOGLEVEL"));
    g_mask.store(m, std::memory_order_relaxed);
  }
  return m;
}

void SetEnabledForTest(unsigned mask) { g_mask.store(mask, std::memory_order_relaxed); }

const char* SubsystemName(Subsystem s) {
  switch (s) {
    case kRdzv:
      return "rdzv";
    case kAgent:
      return "agent";
    case kStore:
      return "store";
    case kSdk:
      return "sdk";
  }
  return "?";
}

Line::Line(Subsystem s) { out_ << "[ddprun:" << SubsystemName(s) << " " << ::getpid() << "] "; }

Line::~Line() {
  out_ << '\n';
  const std::string text = out_.str();
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace ddprun::debug
