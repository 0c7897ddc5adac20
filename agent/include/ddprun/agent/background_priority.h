// The CPU priority of the agent's background checkpoint threads (the
// --ckpt_dir persister and the --ckpt_replicas sender): they run at nice
// kBackgroundNice, so that on a node whose cores the training keeps busy
// they take the cycles the workers leave and do not slow the steps (the
// scheduler still gives them a share, so they finish: weight 110 against a
// worker's 1024). Work the job waits for (a flush on SIGTERM or at the end)
// asks for nice 0 again, which Linux grants only with CAP_SYS_NICE or an
// RLIMIT_NICE that allows it; without, it goes on at nice kBackgroundNice.
#pragma once

namespace ddprun::agent {

inline constexpr int kBackgroundNice = 10;

// Sets the calling thread's nice value to kBackgroundNice (best effort).
void LowerThreadPriority();

// Sets the calling thread's nice value back to 0 where permitted; false
// where not (it keeps kBackgroundNice).
bool RestoreThreadPriority();

}  // namespace ddprun::agent
