// The agent's monitoring (docs/monitoring-sources.md): one metrics channel
// and one stack file per worker, the worker environment that names them, and
// a reporter thread that samples the workers about once a second
// (MetricsCollector), sends the node's MetricsReport through the
// RendezvousSession, takes the stacks the server asks for and prints the
// hang report it sends, once.
//
// Threads: the agent's main thread calls every public method; they only
// take a mutex for a few microseconds (never a system call of the reporter's
// or a network round trip), so the round loop never waits on monitoring.
// The reporter thread owns the network and the stack captures.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/agent/metrics_collector.h"
#include "ddprun/agent/rendezvous_session.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::agent {

// The directory with ddprun_metrics.py and ddprun_hook/sitecustomize.py:
// next to the executable (the build tree's python/, an install's
// lib/ddprun/python) or the configured install prefix; "" if none.
std::string FindPythonHookDir();

class Monitoring {
 public:
  struct Options {
    std::string job_id;
    std::string host;
    bool python_hook = true;
    std::string python_dir;  // FindPythonHookDir(); "" = no hook
    rendezvous::Duration interval = std::chrono::seconds(1);
    rendezvous::Duration report_timeout = std::chrono::seconds(2);
    rendezvous::Duration stack_budget = std::chrono::seconds(10);
    // Fills each sample's checkpoint fields (RankSample::has_checkpoint and
    // after) from the node's checkpoint memory; called on the reporter
    // thread, outside the lock, before each report. Unset: none.
    std::function<void(std::vector<rendezvous::RankSample>*)> checkpoints;
  };
  using Logger = std::function<void(const std::string&)>;
  // `print` writes a block (the hang report) to the console as it is.
  Monitoring(Options options, RendezvousSession& session, const rendezvous::Clock& clock,
             Logger log, Logger print, std::unique_ptr<ProcSource> proc = nullptr,
             std::unique_ptr<GpuSource> gpu = nullptr);
  ~Monitoring();

  // A round starts with these workers (one channel and stack file each).
  // `keep`: the local ranks whose processes go on from the previous round
  // (--restart_policy=inplace): their channel and stack files are kept (the
  // process holds them), and MaxSteps counts their steps from now.
  void BeginRound(const rendezvous::Assignment& assignment, const std::set<int>& keep = {});
  // The variables that name a worker's channel and stack file, and the
  // Python hook on PYTHONPATH (after BeginRound).
  void AddWorkerEnv(int local_rank, std::map<std::string, std::string>* env) const;
  void WorkerStarted(int local_rank, pid_t pid);
  void WorkerState(int local_rank, const std::string& state);
  // A membership or restart event for the next report ("worker 3 exited 1").
  void Event(std::string event);
  // The round's workers are gone: reporting stops until the next round.
  // keep_files: the processes go on into the next round (an in-place
  // restart's survivors): their channel and stack files stay open for
  // BeginRound's `keep`.
  void EndRound(bool keep_files = false);
  // The most steps any worker of the round has completed (its channel's
  // counter, read now: a few preads, no lock held by the reporter).
  std::int64_t MaxSteps() const;
  // The stack of local rank j's process `pid` now (stack_capture.h), within
  // `budget`; for the agent's own decisions (--restart_policy=inplace). Only
  // a worker whose metrics channel was sampled (it says how to ask for the
  // stack); otherwise an empty dump with its reason, nothing signalled.
  rendezvous::StackDump CaptureLocal(int local_rank, pid_t pid, rendezvous::Duration budget);
  // The node's latest finished recovery, sent with every report from now on
  // (the hub keeps it per round and node); BeginRound clears it.
  void SetRecovery(rendezvous::RecoveryBudget recovery);
  // Starts the reporter thread (its first report comes one interval later);
  // the agent calls it once the round's workers are spawned, so that the
  // thread is not started on the way to the first spawn. Idempotent.
  void Start();
  // Stops the reporter (before the session closes). Idempotent.
  void Stop();

 private:
  struct Files {
    int channel_fd = -1;
    int stack_fd = -1;
    std::int64_t base_steps = 0;  // the channel's steps when the round began
  };
  void Run();
  void Tick();
  void CloseFiles();

  const Options options_;
  RendezvousSession& session_;
  const rendezvous::Clock& clock_;
  Logger log_, print_;
  std::unique_ptr<ProcSource> proc_;
  std::unique_ptr<GpuSource> gpu_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;                                   // report again at once (stacks taken)
  bool off_ = false;                                    // the server has no monitoring
  MetricsCollector collector_;                          // under mu_
  std::optional<rendezvous::Assignment> round_;         // under mu_
  std::vector<Files> files_;                            // by local rank, under mu_
  std::deque<std::string> events_;                      // under mu_
  std::optional<rendezvous::RecoveryBudget> recovery_;  // under mu_
  std::vector<rendezvous::StackDump> stacks_;           // reporter thread only
  std::set<std::string> printed_;                       // hang reports printed (reporter only)
  std::thread thread_;
};

}  // namespace ddprun::agent
