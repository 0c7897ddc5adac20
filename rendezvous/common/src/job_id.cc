#include "ddprun/rendezvous/common/job_id.h"

#include <cstdint>
#include <cstdio>
#include <random>

namespace ddprun::rendezvous {
namespace {

bool Allowed(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == ':' || c == '@' || c == '+';
}

constexpr const char* kRule =
    "use 1-256 letters, digits and '-', '_', '.', ':', '@', '+', not starting with '-' or '.'";

}  // namespace

absl::Status ValidateJobId(std::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError(std::string("the job id is empty; ") + kRule);
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError("the job id is longer than 256 bytes; " + std::string(kRule));
  }
  if (id.front() == '-' || id.front() == '.') {
    return absl::InvalidArgumentError("the job id '" + std::string(id) + "' starts with '" +
                                      id.front() + "'; " + kRule);
  }
  for (char c : id) {
    if (!Allowed(c)) {
      const bool printable = c > 0x20 && c < 0x7f;
      std::string what = c == ' '    ? "a space"
                         : printable ? std::string("'") + c + "'"
                                     : "a control or non-ASCII byte";
      // Only printable ids are echoed back: bytes from strangers stay out of logs.
      std::string shown = id.size() <= 64 ? std::string(id) : std::string(id.substr(0, 64)) + "...";
      for (char& ch : shown) {
        if (!(ch > 0x20 && ch < 0x7f) && ch != ' ') ch = '?';
      }
      return absl::InvalidArgumentError("the job id '" + shown + "' contains " + what + "; " +
                                        kRule);
    }
  }
  return absl::OkStatus();
}

std::string RandomJobId() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> dist;
  std::uint32_t w[4];
  for (auto& x : w) x = dist(rd);
  w[1] = (w[1] & 0xffff0fffu) | 0x00004000u;  // version 4
  w[2] = (w[2] & 0x3fffffffu) | 0x80000000u;  // variant 10
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%04x%08x", w[0], w[1] >> 16,
                w[1] & 0xffff, w[2] >> 16, w[2] & 0xffff, w[3]);
  return buf;
}

}  // namespace ddprun::rendezvous
