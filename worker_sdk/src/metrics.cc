// ddp::metrics (ddp/metrics.h) over the process's metrics channel.
#include "ddp/metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "backend.h"
#include "ddp/types.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "metrics.h"

namespace ddp {
namespace detail {
namespace {

namespace rdzv = ::ddprun::rendezvous;

std::unique_ptr<rdzv::ChannelWriter> OpenChannel() {
  const char* path = std::getenv(ddprun::kEnvMetricsFile);
  if (path == nullptr || *path == '\0') return nullptr;
  auto writer = rdzv::ChannelWriter::Open(path);
  if (writer.ok()) return std::move(*writer);
  // Another process of this worker owns it (the Python hook of a parent):
  // that one reports; this one stays quiet.
  if (writer.status().code() != absl::StatusCode::kAlreadyExists) {
    std::fprintf(stderr, "ddp: metrics off for this worker: %s\n",
                 std::string(writer.status().message()).c_str());
  }
  return nullptr;
}

}  // namespace

rdzv::ChannelWriter* MetricsChannel() {
  static rdzv::ChannelWriter* const channel = OpenChannel().release();  // lives until exit
  return channel;
}

double BusBandwidthGbps(const char* op, std::int64_t input_bytes, double seconds, int ranks) {
  if (seconds <= 0 || ranks < 1 || input_bytes <= 0) return 0;
  const double n = ranks;
  const double algbw = static_cast<double>(input_bytes) / seconds / 1e9;
  if (std::strcmp(op, "allreduce") == 0) return algbw * 2 * (n - 1) / n;
  if (std::strcmp(op, "allgather") == 0) return algbw * (n - 1);  // input is 1/n of the result
  if (std::strcmp(op, "reduce_scatter") == 0) return algbw * (n - 1) / n;
  if (std::strcmp(op, "broadcast") == 0) return algbw;
  return 0;
}

class CollectiveRecord {
 public:
  CollectiveRecord(rdzv::ChannelWriter* channel, std::string op, std::int64_t bytes, int ranks)
      : channel_(channel), op_(std::move(op)), bytes_(bytes), ranks_(ranks) {
    channel_->CollectiveStart(op_);
    t0_ = std::chrono::steady_clock::now();
  }
  ~CollectiveRecord() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    channel_->CollectiveEnd(op_, bytes_, s, BusBandwidthGbps(op_.c_str(), bytes_, s, ranks_));
  }
  CollectiveRecord(const CollectiveRecord&) = delete;
  CollectiveRecord& operator=(const CollectiveRecord&) = delete;

 private:
  rdzv::ChannelWriter* channel_;
  std::string op_;
  std::int64_t bytes_;
  int ranks_;
  std::chrono::steady_clock::time_point t0_;
};

std::shared_ptr<CollectiveRecord> BeginCollective(const OpDesc& op, int ranks) {
  rdzv::ChannelWriter* channel = MetricsChannel();
  if (channel == nullptr) return nullptr;
  return std::make_shared<CollectiveRecord>(channel, op.op, op.bytes(), ranks);
}

std::function<void()> RecordCollective(const OpDesc& op, std::function<void()> run, int ranks) {
  if (MetricsChannel() == nullptr) return run;
  return [op, ranks, run = std::move(run)] {
    // The end is recorded when `rec` goes, when `run` throws too.
    const std::shared_ptr<CollectiveRecord> rec = BeginCollective(op, ranks);
    if (run) run();
  };
}

}  // namespace detail

namespace metrics {
namespace {

using Clock = std::chrono::steady_clock;

std::mutex& StepMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

void Step(double samples) {
  auto* channel = detail::MetricsChannel();
  if (channel == nullptr) return;
  static Clock::time_point last{};  // under StepMutex()
  double seconds = std::nan("");
  {
    std::lock_guard<std::mutex> lock(StepMutex());
    const Clock::time_point now = Clock::now();
    if (last != Clock::time_point{}) seconds = std::chrono::duration<double>(now - last).count();
    last = now;
  }
  channel->Step(std::isfinite(samples) ? samples : -1, seconds);
}

bool Scalar(std::string_view name, double value) {
  auto* channel = detail::MetricsChannel();
  if (channel == nullptr) return false;
  return channel->Scalar(name, value);
}

bool Enabled() { return detail::MetricsChannel() != nullptr; }

}  // namespace metrics
}  // namespace ddp
