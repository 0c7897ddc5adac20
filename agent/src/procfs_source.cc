// ProcSource over /proc (metrics_collector.h): one pass over /proc/<pid>/stat.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "ddprun/agent/metrics_collector.h"

namespace ddprun::agent {
namespace {

// Parses /proc/<pid>/stat: the fields after the command name's closing
// parenthesis (the name may hold spaces and parentheses).
bool ParseStat(const char* buf, long page_size, ProcStat* out) {
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  ++p;
  // Tokens after ')': 0 state, 1 ppid, 2 pgrp, ..., 11 utime, 12 stime, ..., 21 rss.
  std::uint64_t fields[22] = {};
  for (int i = 0; i < 22; ++i) {
    while (*p == ' ') ++p;
    if (*p == '\0') return false;
    if (i == 0) {
      ++p;  // the state letter
    } else {
      char* end = nullptr;
      const long long v = std::strtoll(p, &end, 10);
      if (end == p) return false;
      fields[i] = v < 0 ? 0 : static_cast<std::uint64_t>(v);
      p = end;
    }
  }
  out->pgid = static_cast<pid_t>(fields[2]);
  out->cpu_ticks = fields[11] + fields[12];
  out->rss_bytes = fields[21] * static_cast<std::uint64_t>(page_size);
  return true;
}

class ProcfsSource final : public ProcSource {
 public:
  ProcfsSource()
      : hz_(static_cast<double>(::sysconf(_SC_CLK_TCK))), page_size_(::sysconf(_SC_PAGESIZE)) {}

  std::vector<ProcStat> Scan() override {
    std::vector<ProcStat> out;
    DIR* dir = ::opendir("/proc");
    if (dir == nullptr) return out;
    char path[320];
    char buf[1024];
    while (struct dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      std::snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;  // gone meanwhile
      const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
      ::close(fd);
      if (n <= 0) continue;
      buf[n] = '\0';
      ProcStat s;
      s.pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (ParseStat(buf, page_size_, &s)) out.push_back(s);
    }
    ::closedir(dir);
    return out;
  }

  double ticks_per_second() const override { return hz_; }

 private:
  double hz_;
  long page_size_;
};

}  // namespace

std::unique_ptr<ProcSource> MakeProcfsSource() { return std::make_unique<ProcfsSource>(); }

}  // namespace ddprun::agent
