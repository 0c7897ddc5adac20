#include "ddprun/rendezvous/common/clock.h"

#include <ctime>

namespace ddprun::rendezvous {

std::string WallClockAfter(Duration from_now) {
  const auto wall = std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(from_now);
  const std::time_t t = std::chrono::system_clock::to_time_t(wall);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

}  // namespace ddprun::rendezvous
