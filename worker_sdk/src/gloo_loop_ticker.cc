#include "gloo_loop_ticker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <exception>

#include "gloo/transport/tcp/device.h"

namespace ddp::detail {

std::unique_ptr<LoopTicker> LoopTicker::Attach(
    const std::shared_ptr<gloo::transport::Device>& device) {
  auto tcp = std::dynamic_pointer_cast<gloo::transport::tcp::Device>(device);
  if (!tcp) return nullptr;
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  std::unique_ptr<LoopTicker> ticker(new LoopTicker(device, fd));
  try {
    tcp->registerDescriptor(fd, EPOLLIN, ticker.get());
  } catch (const std::exception&) {
    ticker->device_.reset();  // never registered: the destructor only closes
    return nullptr;
  }
  return ticker;
}

LoopTicker::LoopTicker(std::weak_ptr<gloo::transport::Device> device, int fd)
    : device_(std::move(device)), fd_(fd) {}

LoopTicker::~LoopTicker() {
  if (stop_) *stop_ = true;  // a scope outliving the ticker: a caller's bug
  if (thread_.joinable()) thread_.join();
  // A device still alive (someone else holds it) may still call this
  // handler: take it out of the loop, which waits for one turn. Gone, its
  // loop was joined and nothing calls it any more.
  if (auto device = std::dynamic_pointer_cast<gloo::transport::tcp::Device>(device_.lock())) {
    try {
      device->unregisterDescriptor(fd_, this);
    } catch (const std::exception&) {
      // Not registered any more: nothing can call it.
    }
  }
  ::close(fd_);
}

void LoopTicker::handleEvents(int /*events*/) {
  std::uint64_t count = 0;
  // Drained so that the loop sleeps again until the next write.
  [[maybe_unused]] ssize_t n = ::read(fd_, &count, sizeof(count));
  turns_.fetch_add(1, std::memory_order_relaxed);
}

void LoopTicker::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scopes_++ > 0) return;
  if (thread_.joinable()) thread_.join();  // a previous scope's, stopped
  stop_ = std::make_shared<std::atomic<bool>>(false);
  thread_ = std::thread([fd = fd_, stop = stop_] {
    const std::uint64_t one = 1;
    while (!stop->load(std::memory_order_relaxed)) {
      [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
      std::this_thread::sleep_for(kTick);
    }
  });
}

void LoopTicker::Leave() {
  std::thread done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--scopes_ > 0) return;
    *stop_ = true;
    stop_.reset();
    done = std::move(thread_);
  }
  if (done.joinable()) done.join();
}

LoopTicker::Ticking::Ticking(LoopTicker* ticker) : ticker_(ticker) {
  if (ticker_) ticker_->Enter();
}

LoopTicker::Ticking::~Ticking() {
  if (ticker_) ticker_->Leave();
}

}  // namespace ddp::detail
