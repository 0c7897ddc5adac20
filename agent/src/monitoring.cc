// Monitoring (monitoring.h).
#include "monitoring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "ddprun/agent/stack_capture.h"
#include "ddprun/rendezvous/common/debug_log.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/common/worker_env_names.h"
#include "ddprun/rendezvous/monitoring/metrics_channel.h"

#ifndef DDPRUN_INSTALL_PYTHON_DIR
#define DDPRUN_INSTALL_PYTHON_DIR ""
#endif
#ifndef DDPRUN_INSTALL_LIBDIR
#define DDPRUN_INSTALL_LIBDIR "lib"
#endif

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;

bool IsHookDir(const std::string& dir) {
  return !dir.empty() && ::access((dir + "/ddprun_hook/sitecustomize.py").c_str(), R_OK) == 0 &&
         ::access((dir + "/ddprun_metrics.py").c_str(), R_OK) == 0;
}

// A memfd of `size` bytes holding `content` at its start and zeros after it;
// -1 on failure. The zeros are a hole (ftruncate), not written: the 34 KiB
// channel is ~600 bytes of header and zeros, so a worker that never reports
// costs one page, not nine (tmpfs reads a hole as zeros, the worker's mapping
// faults its pages in).
int MakeFile(const std::string& name, std::string_view content, std::size_t size) {
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (size > 0 && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  const std::size_t end = content.size();
  std::size_t done = 0;
  while (done < end) {
    const ssize_t n = ::pwrite(fd, content.data() + done, end - done, static_cast<off_t>(done));
    if (n <= 0) {
      ::close(fd);
      return -1;
    }
    done += static_cast<std::size_t>(n);
  }
  return fd;
}

// A channel's step counter (0 when unreadable).
std::int64_t ChannelSteps(int channel_fd) {
  constexpr off_t kStepsAt =
      offsetof(rdzv::ChannelLayout, progress) + offsetof(rdzv::ProgressSection, steps);
  std::int64_t steps = 0;
  if (channel_fd < 0 ||
      ::pread(channel_fd, &steps, sizeof(steps), kStepsAt) != static_cast<ssize_t>(sizeof(steps))) {
    return 0;
  }
  return steps;
}

std::string FdPath(int fd) { return absl::StrCat("/proc/", ::getpid(), "/fd/", fd); }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string FindPythonHookDir() {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));  // .../bin
    for (const std::string& c :
         {dir + "/../python", dir + "/../" DDPRUN_INSTALL_LIBDIR "/ddprun/python",
          dir + "/../lib/ddprun/python"}) {
      if (IsHookDir(c)) return c;
    }
  }
  return IsHookDir(DDPRUN_INSTALL_PYTHON_DIR) ? DDPRUN_INSTALL_PYTHON_DIR : "";
}

Monitoring::Monitoring(Options options, RendezvousSession& session, const rdzv::Clock& clock,
                       Logger log, Logger print, std::unique_ptr<ProcSource> proc,
                       std::unique_ptr<GpuSource> gpu)
    : options_(std::move(options)),
      session_(session),
      clock_(clock),
      log_(std::move(log)),
      print_(std::move(print)),
      proc_(proc ? std::move(proc) : MakeProcfsSource()),
      gpu_(gpu ? std::move(gpu) : MakeNvmlSource()),
      collector_(*proc_, *gpu_, clock_) {}

void Monitoring::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stop_) return;
  thread_ = std::thread([this] { Run(); });
}

Monitoring::~Monitoring() {
  Stop();
  CloseFiles();
}

void Monitoring::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Monitoring::CloseFiles() {
  for (Files& f : files_) {
    if (f.channel_fd >= 0) ::close(f.channel_fd);
    if (f.stack_fd >= 0) ::close(f.stack_fd);
  }
  files_.clear();
}

void Monitoring::BeginRound(const rdzv::Assignment& a, const std::set<int>& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Files> kept(static_cast<std::size_t>(std::max(a.local_world_size, 0)));
  for (int j : keep) {
    if (j < 0 || j >= static_cast<int>(files_.size()) || j >= a.local_world_size) continue;
    kept[j] = files_[j];
    kept[j].base_steps = ChannelSteps(kept[j].channel_fd);
    files_[j] = Files{};  // not closed below
  }
  CloseFiles();
  round_ = a;
  recovery_.reset();
  std::vector<MonitoredWorker> workers;
  // The channel's first bytes, without its trailing zeros (found once per
  // round, not by a 34 KiB scan per worker).
  const std::string initial = rdzv::InitialChannelBytes();
  const std::string_view header(initial.data(), initial.find_last_not_of('\0') + 1);
  for (int j = 0; j < a.local_world_size; ++j) {
    Files f = kept[j];
    if (f.channel_fd < 0) {
      f.channel_fd =
          MakeFile(absl::StrCat("ddprun-metrics-rank", a.base_rank + j), header, initial.size());
      f.stack_fd = MakeFile(absl::StrCat("ddprun-stack-rank", a.base_rank + j), {}, 0);
    }
    files_.push_back(f);
    MonitoredWorker w;
    w.rank = a.base_rank + j;
    w.local_rank = j;
    w.channel_fd = f.channel_fd;
    workers.push_back(w);
  }
  collector_.Reset(workers, a.master_port);
}

void Monitoring::AddWorkerEnv(int local_rank, std::map<std::string, std::string>* env) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (local_rank < 0 || local_rank >= static_cast<int>(files_.size())) return;
  const Files& f = files_[local_rank];
  if (f.channel_fd >= 0) (*env)[kEnvMetricsFile] = FdPath(f.channel_fd);
  if (f.stack_fd >= 0) (*env)[kEnvStackFile] = FdPath(f.stack_fd);
  if (options_.python_hook && !options_.python_dir.empty()) {
    std::string path = absl::StrCat(options_.python_dir, "/ddprun_hook:", options_.python_dir);
    if (auto it = env->find("PYTHONPATH"); it != env->end() && !it->second.empty()) {
      absl::StrAppend(&path, ":", it->second);
    }
    (*env)["PYTHONPATH"] = path;
  }
}

void Monitoring::WorkerStarted(int local_rank, pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  collector_.SetPid(local_rank, pid);
}

void Monitoring::WorkerState(int local_rank, const std::string& state) {
  std::lock_guard<std::mutex> lock(mu_);
  collector_.SetState(local_rank, state);
}

void Monitoring::Event(std::string event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() < 64) events_.push_back(std::move(event));
}

std::int64_t Monitoring::MaxSteps() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::int64_t most = 0;
  for (const Files& f : files_) most = std::max(most, ChannelSteps(f.channel_fd) - f.base_steps);
  return most;
}

rdzv::StackDump Monitoring::CaptureLocal(int local_rank, pid_t pid, rdzv::Duration budget) {
  StackTarget t;
  t.pid = pid;
  t.host = options_.host;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (round_) t.rank = round_->base_rank + local_rank;
    if (local_rank >= 0 && local_rank < static_cast<int>(files_.size())) {
      t.channel = collector_.LastChannel(local_rank);
      t.stack_fd = files_[local_rank].stack_fd >= 0
                       ? ::fcntl(files_[local_rank].stack_fd, F_DUPFD_CLOEXEC, 0)
                       : -1;
    }
  }
  if (!t.channel) {  // no sample of the worker's channel yet: nothing says how to ask it
    if (t.stack_fd >= 0) ::close(t.stack_fd);
    rdzv::StackDump d;
    d.error = "no metrics channel sample of this worker yet";
    return d;
  }
  rdzv::StackDump d = CaptureStack(t, budget);
  if (t.stack_fd >= 0) ::close(t.stack_fd);
  return d;
}

void Monitoring::SetRecovery(rdzv::RecoveryBudget recovery) {
  std::lock_guard<std::mutex> lock(mu_);
  recovery_ = std::move(recovery);
}

void Monitoring::EndRound(bool keep_files) {
  std::lock_guard<std::mutex> lock(mu_);
  round_.reset();
  collector_.Reset({});
  if (!keep_files) CloseFiles();
  events_.clear();
}

void Monitoring::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !off_) {
    cv_.wait_for(lock, options_.interval, [this] { return stop_ || wake_; });
    wake_ = false;
    if (stop_) break;
    if (!round_) continue;
    lock.unlock();
    Tick();
    lock.lock();
  }
}

void Monitoring::Tick() {
  rdzv::MetricsReport report;
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!round_) return;
    report.job_id = round_->job_id.empty() ? options_.job_id : round_->job_id;
    report.node_id = round_->node_id;
    report.round = round_->round;
    report.host = options_.host;
    report.unix_s = UnixNow();
    report.ranks = collector_.Sample(&warnings);
    report.events.assign(events_.begin(), events_.end());
    report.recovery = recovery_;
    events_.clear();
  }
  for (const std::string& w : warnings) log_(w);
  if (options_.checkpoints) options_.checkpoints(&report.ranks);
  report.stacks = std::move(stacks_);
  stacks_.clear();
  report.store_waits = session_.StoreWaitedKeys(rdzv::kMaxStoreWaitKeys);

  auto reply = session_.ReportMetrics(report, options_.report_timeout);
  if (!reply.ok()) {
    if (absl::IsUnimplemented(reply.status())) {
      log_(
          "the rendezvous has no monitoring (an older ddprund?); live metrics and hang "
          "detection are off for this job");
      std::lock_guard<std::mutex> lock(mu_);
      off_ = true;
      return;
    }
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(report.job_id, report.round)
                             << "metrics report not taken: " << reply.status().message();
    return;
  }
  if (!reply->hang_report.empty() && printed_.insert(reply->hang_report).second) {
    print_(reply->hang_report);
  }
  if (reply->capture_stacks.empty()) return;
  // Take the stacks now (outside the lock, bounded) and report at once.
  for (int rank : reply->capture_stacks) {
    StackTarget t;
    t.rank = rank;
    t.host = options_.host;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!round_) return;
      const int j = rank - round_->base_rank;
      if (j < 0 || j >= static_cast<int>(files_.size())) continue;  // not on this node
      t.channel = collector_.LastChannel(j);
      for (const rdzv::RankSample& r : report.ranks) {
        if (r.rank == rank) t.pid = static_cast<pid_t>(r.pid);
      }
      // A descriptor of our own: EndRound may close the round's meanwhile.
      t.stack_fd = files_[j].stack_fd >= 0 ? ::fcntl(files_[j].stack_fd, F_DUPFD_CLOEXEC, 0) : -1;
    }
    rdzv::StackDump d = CaptureStack(t, options_.stack_budget);
    if (t.stack_fd >= 0) ::close(t.stack_fd);
    DDPRUN_DEBUG_LOG(kAgent) << rdzv::Fence(report.job_id, report.round) << "stack of rank " << rank
                             << ": " << (d.kind.empty() ? d.error : d.kind);
    stacks_.push_back(std::move(d));
  }
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = true;
}

}  // namespace ddprun::agent
