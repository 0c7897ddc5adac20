#include "ddprun/agent/background_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/cpu_binding.h"

namespace ddprun::agent {
namespace {

pid_t ThisThread() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// setpriority(PRIO_PROCESS, tid) sets one thread's nice value on Linux.
bool SetNice(int nice) { return ::setpriority(PRIO_PROCESS, ThisThread(), nice) == 0; }

cpu_set_t ToSet(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  return set;
}

}  // namespace

void LowerThreadPriority() { (void)SetNice(kBackgroundNice); }

bool RestoreThreadPriority() { return SetNice(0); }

absl::Status BackgroundThreads::SetCpus(std::vector<int> cpus) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cpus == cpus_) return absl::OkStatus();
  cpus_ = std::move(cpus);
  applied_ = cpus_.empty() ? ReadAffinity() : cpus_;
  if (applied_.empty()) return absl::OkStatus();
  const cpu_set_t set = ToSet(applied_);
  absl::Status first;
  for (const auto& [tid, name] : tids_) {
    if (::sched_setaffinity(tid, sizeof set, &set) != 0 && first.ok()) {
      first =
          absl::InternalError(absl::StrCat("cannot move thread ", name, " (", tid, ") to CPUs ",
                                           FormatCpuList(applied_), ": ", std::strerror(errno)));
    }
  }
  return first;
}

std::vector<int> BackgroundThreads::cpus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cpus_;
}

BackgroundThreads::Member::Member(BackgroundThreads* owner, const char* name)
    : owner_(owner), tid_(ThisThread()) {
  (void)::pthread_setname_np(::pthread_self(), name);
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mu_);
  owner_->tids_.emplace(tid_, name);
  // Before the first SetCpus the thread keeps the affinity it inherited.
  if (owner_->applied_.empty()) return;
  const cpu_set_t set = ToSet(owner_->applied_);
  // Best effort: a set the kernel refuses was refused when SetCpus moved
  // the members present, and said then.
  (void)::sched_setaffinity(0, sizeof set, &set);
}

BackgroundThreads::Member::~Member() {
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mu_);
  owner_->tids_.erase(tid_);
}

}  // namespace ddprun::agent
