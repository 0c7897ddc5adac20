// ProcSource over /proc (metrics_collector.h): one pass over /proc/<pid>/stat.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

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

// The socket inodes among /proc/<pid>/fd.
std::set<unsigned long> SocketInodes(pid_t pid) {
  std::set<unsigned long> out;
  const std::string dir_path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(dir_path.c_str());
  if (dir == nullptr) return out;
  char link[64];
  while (struct dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string fd_path = dir_path + "/" + e->d_name;
    const ssize_t n = ::readlink(fd_path.c_str(), link, sizeof(link) - 1);
    if (n <= 0) continue;
    link[n] = '\0';
    if (std::strncmp(link, "socket:[", 8) == 0) out.insert(std::strtoul(link + 8, nullptr, 10));
  }
  ::closedir(dir);
  return out;
}

// Whether a /proc/<pid>/net/tcp{,6} table has an ESTABLISHED (state 01) row
// to remote port `port` whose inode is one of `inodes`.
bool TableHasConnection(const std::string& path, int port, const std::set<unsigned long>& inodes) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    char local[64], remote[64], st[8];
    unsigned long inode = 0;
    if (std::sscanf(line.c_str(), " %*s %63s %63s %7s %*s %*s %*s %*s %*s %lu", local, remote, st,
                    &inode) != 4) {
      continue;
    }
    if (std::strcmp(st, "01") != 0 || inodes.count(inode) == 0) continue;
    const char* colon = std::strrchr(remote, ':');
    if (colon != nullptr && std::strtol(colon + 1, nullptr, 16) == port) return true;
  }
  return false;
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

  bool ConnectedToPort(pid_t pid, int port) override {
    const std::set<unsigned long> inodes = SocketInodes(pid);
    if (inodes.empty()) return false;
    const std::string net = "/proc/" + std::to_string(pid) + "/net/";
    return TableHasConnection(net + "tcp", port, inodes) ||
           TableHasConnection(net + "tcp6", port, inodes);
  }

 private:
  double hz_;
  long page_size_;
};

}  // namespace

std::unique_ptr<ProcSource> MakeProcfsSource() { return std::make_unique<ProcfsSource>(); }

}  // namespace ddprun::agent
