// How the agent's background checkpoint threads (the --ckpt_dir persister,
// the --ckpt_replicas sender, the replica server's acceptor and the threads
// that receive replicas and serve fetches) keep out of the workers' way
// (docs/checkpoint.md, "Background priority").
//
// Priority: they run at nice kBackgroundNice, so that on a node whose cores
// the training keeps busy they take the cycles the workers leave and do not
// slow the steps (the scheduler still gives them a share, so they finish:
// weight 110 against a worker's 1024). Work the job waits for (a flush on
// SIGTERM or at the end) asks for nice 0 again, which Linux grants only with
// CAP_SYS_NICE or an RLIMIT_NICE that allows it; without, it goes on at nice
// kBackgroundNice.
//
// CPUs: while the agent binds its workers (--cpu_bind, --numa_binding), they
// run on the CPUs no worker of this agent is bound to (BackgroundCpus in
// cpu_binding.h computes them where the binding is planned; the agent hands
// them to BackgroundThreads::SetCpus). Each such thread is a
// BackgroundThreads::Member for its whole life, named so that users and
// tests see it in /proc/<agent>/task/*/comm.
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ddprun::agent {

inline constexpr int kBackgroundNice = 10;

// Sets the calling thread's nice value to kBackgroundNice (best effort).
void LowerThreadPriority();

// Sets the calling thread's nice value back to 0 where permitted; false
// where not (it keeps kBackgroundNice).
bool RestoreThreadPriority();

// The threads' names (at most 15 characters: the kernel's limit).
inline constexpr const char* kPersistThreadName = "ckpt-persist";
inline constexpr const char* kSendThreadName = "ckpt-send";
inline constexpr const char* kAcceptThreadName = "ckpt-accept";
inline constexpr const char* kReceiveThreadName = "ckpt-recv";

// The agent's background checkpoint threads and the CPUs they may run on.
// One per agent, owned by it, outliving every thread that joins it. Thread
// safe.
class BackgroundThreads {
 public:
  // Confines every member, present and future, to `cpus` (empty: no
  // confinement, every CPU of the agent's own affinity, as the caller's
  // thread has it: call it from the agent's main thread). A set equal to
  // the current one changes nothing. An error names the first thread the
  // kernel refused (the others are still moved); the caller says it once.
  absl::Status SetCpus(std::vector<int> cpus);
  // The current set (empty: not confined).
  std::vector<int> cpus() const;

  // Held by a background thread for as long as it runs (constructed and
  // destroyed on that thread): names the thread `name` and confines it to
  // the owner's set, now and whenever SetCpus changes it. A null owner only
  // names the thread (a service running without an agent: tests, benches).
  class Member {
   public:
    Member(BackgroundThreads* owner, const char* name);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

   private:
    BackgroundThreads* owner_;
    pid_t tid_;
  };

 private:
  mutable std::mutex mu_;
  std::vector<int> cpus_;  // as SetCpus was given, guarded by mu_
  // What the members were moved to (cpus_, or the agent's whole affinity
  // when cpus_ is empty); empty before the first SetCpus that changed
  // anything: the members keep what they inherited. Guarded by mu_.
  std::vector<int> applied_;
  std::map<pid_t, std::string> tids_;  // the members' thread ids and names, guarded by mu_
};

}  // namespace ddprun::agent
