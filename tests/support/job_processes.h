// What one test's jobs hold on the machine, told apart from what other
// tests and jobs running at the same time hold (parallel ctest, another
// checkout's run): a check that something of a job is gone looks only at
// that job's processes and names, never at the whole machine.
//
// A test's processes are those whose command line names its Harness
// directory: every launcher of a test gets its script from there, and so
// does every worker, orphaned or not. A zombie has an empty command line
// and holds no descriptor, so it is rightly left out.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

namespace ddprun::test {

// The live processes whose command line contains `mark` (one of its
// arguments, or part of one), this test process excluded.
inline std::vector<pid_t> ProcessesNaming(const std::string& mark) {
  std::vector<pid_t> out;
  for (const std::string& n : ListDir("/proc")) {
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(n));
    if (pid == ::getpid()) continue;
    if (ReadFile("/proc/" + n + "/cmdline").find(mark) != std::string::npos) out.push_back(pid);
  }
  return out;
}

// Of `pids`, those holding a descriptor whose target contains `target`
// ("memfd:ddprun-ckpt-", "memfd:ddprun-replica"): pid -> the distinct
// targets it holds ("/memfd:ddprun-ckpt-0 (deleted)"; a duplicate, such as
// Python's mmap of it, counts once).
inline std::map<pid_t, std::set<std::string>> DescriptorHolders(const std::vector<pid_t>& pids,
                                                                const std::string& target) {
  std::map<pid_t, std::set<std::string>> holders;
  for (pid_t pid : pids) {
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    for (const std::string& fd : ListDir(fd_dir)) {
      char link[256] = {};
      const ssize_t n = ::readlink((fd_dir + "/" + fd).c_str(), link, sizeof link - 1);
      if (n > 0 && std::string(link, n).find(target) != std::string::npos) {
        holders[pid].insert(std::string(link, n));
      }
    }
  }
  return holders;
}

// The processes of a test (ProcessesNaming(mark)) that hold `target`.
inline std::map<pid_t, std::set<std::string>> DescriptorHoldersNaming(const std::string& mark,
                                                                      const std::string& target) {
  return DescriptorHolders(ProcessesNaming(mark), target);
}

// The entries of /dev/shm that agents with these pids made: the temporary
// directory of error files, "ddprun_<agent pid>_XXXXXX" (agent/src/worker_logs.cc),
// the one thing ddprun names there.
inline std::set<std::string> DevShmOf(const std::vector<pid_t>& agents) {
  std::set<std::string> out;
  for (const std::string& n : ListDir("/dev/shm")) {
    for (pid_t pid : agents) {
      if (n.rfind("ddprun_" + std::to_string(pid) + "_", 0) == 0) out.insert(n);
    }
  }
  return out;
}

}  // namespace ddprun::test
