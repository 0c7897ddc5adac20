#include "comm_queue.h"

#include "absl/strings/str_cat.h"

namespace ddp::detail {

QueuedWork::QueuedWork(std::weak_ptr<Backend> owner, std::string desc, Duration default_timeout)
    : owner_(std::move(owner)), desc_(std::move(desc)), default_timeout_(default_timeout) {}

void QueuedWork::Complete(absl::Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;  // an abort completed it first
    done_ = true;
    status_ = std::move(s);
  }
  cv_.notify_all();
}

absl::Status QueuedWork::Wait(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cv_.wait_for(lock, timeout, [&] { return done_; })) return status_;
  lock.unlock();
  const std::string what =
      absl::StrCat(desc_, " did not complete within ", timeout.count() / 1000.0, " s");
  std::string fence;
  if (auto b = owner_.lock()) {
    b->Fail(what);
    fence = b->Fence();
  }
  return absl::DeadlineExceededError(
      absl::StrCat(fence, what, " (a peer is slow, hung or issued a different collective)"));
}

absl::StatusOr<bool> QueuedWork::IsCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && !status_.ok()) return status_;
  return done_;
}

absl::Status QueuedWork::WaitDefault() { return Wait(default_timeout_ + std::chrono::seconds(5)); }

void CommQueue::Start(ErrorHandler on_error, std::shared_ptr<void> keep_alive) {
  state_->on_error = std::move(on_error);
  thread_ = std::thread(&CommQueue::Loop, state_, std::move(keep_alive));
}

void CommQueue::Stop(bool detach_if_busy) {
  if (!thread_.joinable()) return;
  bool busy;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
    busy = state_->busy;
  }
  state_->cv.notify_all();
  if (busy && detach_if_busy) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void CommQueue::Push(std::string desc, std::function<void()> run,
                     std::shared_ptr<QueuedWork> work) {
  if (!run) run = [] {};
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(QueuedTask{std::move(desc), std::move(run), std::move(work)});
  }
  state_->cv.notify_one();
}

std::shared_ptr<QueuedWork> CommQueue::Running() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running;
}

bool CommQueue::OnQueueThread() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->loop_thread == std::this_thread::get_id();
}

std::deque<QueuedTask> CommQueue::TakeQueued() {
  std::deque<QueuedTask> taken;
  std::lock_guard<std::mutex> lock(state_->mu);
  taken.swap(state_->queue);
  return taken;
}

bool CommQueue::TryClaim() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!thread_.joinable() || state_->stop || state_->busy || state_->claimed ||
      !state_->queue.empty()) {
    return false;
  }
  state_->claimed = true;
  return true;
}

void CommQueue::Release() {
  bool queued;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->claimed = false;
    queued = !state_->queue.empty();
  }
  if (queued) state_->cv.notify_one();
}

void CommQueue::Release(QueuedTask rest) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->claimed = false;
    state_->queue.push_front(std::move(rest));
  }
  state_->cv.notify_one();
}

void CommQueue::Loop(std::shared_ptr<State> state, std::shared_ptr<void> keep_alive) {
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->loop_thread = std::this_thread::get_id();
  }
  for (;;) {
    QueuedTask task;
    {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock,
                     [&] { return !state->claimed && (state->stop || !state->queue.empty()); });
      if (state->queue.empty()) return;  // stop requested and nothing left
      task = std::move(state->queue.front());
      state->queue.pop_front();
      state->busy = true;
      state->running = task.work;
    }
    absl::Status status;
    try {
      task.run();
    } catch (...) {
      status = state->on_error(task.desc, std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->busy = false;
      state->running.reset();
    }
    task.work->Complete(std::move(status));
  }
}

}  // namespace ddp::detail
