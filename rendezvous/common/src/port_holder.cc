#include "ddprun/rendezvous/common/port_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {
namespace {

constexpr const char* kTcpListen = "0A";  // TCP_LISTEN in /proc/net/tcp's "st" column

// The inodes of the sockets listening on `port` in one /proc/net/tcp table.
void ListeningInodes(const std::string& table, int port, std::set<std::string>* inodes) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode)) {
      continue;
    }
    const std::size_t colon = local.rfind(':');
    if (colon == std::string::npos || state != kTcpListen) continue;
    if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port && inode != "0") {
      inodes->insert(inode);
    }
  }
}

// The program's name as started: argv[0]'s last component (a program that
// re-executes itself through /proc/self/exe keeps it, its comm becomes
// "exe"), else its comm.
std::string ProgramName(const std::string& pid) {
  std::ifstream cmdline("/proc/" + pid + "/cmdline");
  std::string argv0;
  std::getline(cmdline, argv0, '\0');
  if (!argv0.empty()) return argv0.substr(argv0.rfind('/') + 1);
  std::ifstream comm("/proc/" + pid + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

}  // namespace

std::string DescribePortHolder(int port) {
  std::set<std::string> inodes;
  ListeningInodes("/proc/net/tcp", port, &inodes);
  ListeningInodes("/proc/net/tcp6", port, &inodes);
  if (inodes.empty()) return "";
  std::set<std::string> links;
  for (const std::string& inode : inodes) links.insert("socket:[" + inode + "]");
  DIR* proc = ::opendir("/proc");
  std::string found;
  for (struct dirent* p = proc ? ::readdir(proc) : nullptr; p != nullptr && found.empty();
       p = ::readdir(proc)) {
    const std::string pid = p->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());  // fails for other users' processes
    if (fds == nullptr) continue;
    for (struct dirent* fd = ::readdir(fds); fd != nullptr; fd = ::readdir(fds)) {
      char target[64] = {};
      const std::string path = fd_dir + "/" + fd->d_name;
      const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
      if (n > 0 && links.count(std::string(target, n)) > 0) {
        found = absl::StrCat("pid ", pid, " (", ProgramName(pid), ")");
        break;
      }
    }
    ::closedir(fds);
  }
  if (proc != nullptr) ::closedir(proc);
  if (!found.empty()) return found;
  return absl::StrCat("a process of another user (see: sudo ss -ltnp 'sport = :", port, "')");
}

}  // namespace ddprun::rendezvous
