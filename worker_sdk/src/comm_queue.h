// The communication thread of a CPU group: collectives queued by the caller
// (the backward pass) run on it one at a time, in issue order, while the
// caller goes on; each completes its QueuedWork.
//
// Gloo has no abort, so a thread may be stuck in a collective of an aborted
// group until Gloo's own timeout fires. Such a thread is detached when the
// group is destroyed (Stop(detach_if_busy)) and finishes on its own: it holds
// its queue's state and the `keep_alive` object its tasks point into.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "backend.h"

namespace ddp::detail {

// One queued collective and its completion. A Wait that times out aborts the
// owner (Backend::Fail) and returns DeadlineExceeded.
class QueuedWork final : public WorkState {
 public:
  QueuedWork(std::weak_ptr<Backend> owner, std::string desc, Duration default_timeout);

  // The first call wins: the queue's thread, or an abort that fails the
  // work before the thread is done with it (a lost peer: fail fast).
  void Complete(absl::Status s);

  const std::string& desc() const { return desc_; }
  absl::Status Wait(Duration timeout) override;
  absl::StatusOr<bool> IsCompleted() override;
  absl::Status Synchronize(void*) override { return WaitDefault(); }
  // The group's timeout plus 5 s: the backend's own timeout reports first.
  absl::Status WaitDefault() override;

 private:
  std::weak_ptr<Backend> owner_;
  std::string desc_;
  Duration default_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

struct QueuedTask {
  std::string desc;           // "allreduce(1024 x f32, sum)", for messages
  std::function<void()> run;  // may throw; see CommQueue::ErrorHandler
  std::shared_ptr<QueuedWork> work;
};

class CommQueue {
 public:
  // Turns what a task threw into its Status (and may abort the group). Runs
  // on the queue's thread. An exception it does not handle ends the process.
  using ErrorHandler = std::function<absl::Status(const std::string& desc, std::exception_ptr)>;

  CommQueue() = default;
  ~CommQueue() { Stop(false); }
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Starts the thread. `keep_alive` lives until the thread exits.
  void Start(ErrorHandler on_error, std::shared_ptr<void> keep_alive);
  // Runs what is queued, then ends the thread and joins it; with
  // detach_if_busy, a thread inside a task is detached instead. Idempotent.
  void Stop(bool detach_if_busy);

  // Queues `run` (nullptr: nothing to do, but completes after earlier work).
  void Push(std::string desc, std::function<void()> run, std::shared_ptr<QueuedWork> work);
  // The work of the task the thread runs now (null when idle).
  std::shared_ptr<QueuedWork> Running();
  // Whether the caller is the queue's thread (which completes its own task).
  bool OnQueueThread() const;
  // Removes every task not started yet (an abort completes their works).
  std::deque<QueuedTask> TakeQueued();

  // The caller may run a collective itself, without a thread handoff, when
  // nothing is queued or running: TryClaim reserves the group's issue order
  // for it (the thread starts nothing while claimed) and Release ends the
  // claim. Release(rest) hands the thread the collective's remainder, which
  // runs before anything queued meanwhile. Only the claiming thread releases.
  bool TryClaim();
  void Release();
  void Release(QueuedTask rest);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<QueuedTask> queue;
    bool stop = false;
    bool busy = false;
    bool claimed = false;  // a caller runs a collective (TryClaim)
    std::shared_ptr<QueuedWork> running;
    std::thread::id loop_thread;
    ErrorHandler on_error;
  };
  static void Loop(std::shared_ptr<State> state, std::shared_ptr<void> keep_alive);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace ddp::detail
