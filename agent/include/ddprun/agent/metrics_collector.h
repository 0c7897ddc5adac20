// The agent's per-worker sampling for monitoring (docs/monitoring-sources.md):
// each worker's metrics channel, its CPU and memory from /proc, its GPU from
// NVML, folded into the RankSamples of one MetricsReport.
//
// No threads, no sockets: the sources are seams (ProcSource, GpuSource),
// the clock is injected, and a channel is any file descriptor. The agent's
// reporter thread (monitoring.h) calls Sample() about once a second.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/monitoring/metrics_channel.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"

namespace ddprun::agent {

// One process as /proc/<pid>/stat shows it.
struct ProcStat {
  pid_t pid = 0;
  pid_t pgid = 0;
  std::uint64_t cpu_ticks = 0;  // utime + stime, in clock ticks
  std::uint64_t rss_bytes = 0;
};

class ProcSource {
 public:
  virtual ~ProcSource() = default;
  // Every process of this machine that can be read (one pass over /proc).
  virtual std::vector<ProcStat> Scan() = 0;
  virtual double ticks_per_second() const = 0;
  // Whether process `pid` holds an established TCP connection (IPv4 or
  // IPv6) to remote port `port`; false when it cannot be read.
  virtual bool ConnectedToPort(pid_t pid, int port) = 0;
};
std::unique_ptr<ProcSource> MakeProcfsSource();

// The GPU use of a set of processes.
struct GpuUse {
  double util_percent = -1;  // < 0: n/a
  std::uint64_t mem_bytes = 0;
};
class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // For the processes in `pids`: the highest utilisation of the devices
  // they run on, and the device memory they use. n/a when there is no
  // NVML or no GPU, never an error.
  virtual GpuUse Sample(const std::set<pid_t>& pids) = 0;
};
// NVML, loaded with dlopen("libnvidia-ml.so.1") on first use; without it
// every sample is n/a.
std::unique_ptr<GpuSource> MakeNvmlSource();

// One worker the collector samples.
struct MonitoredWorker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;  // 0 until spawned
  std::string state = "running";
  int channel_fd = -1;  // the metrics channel (owned by the caller)
};

class MetricsCollector {
 public:
  MetricsCollector(ProcSource& proc, GpuSource& gpu, const rendezvous::Clock& clock);

  // Starts a round: forgets the previous one's counters. `store_port`: the
  // round's store (MASTER_PORT); a worker's process group connected to it
  // reached init_process_group (RankSample::reached_store). 0: not checked.
  void Reset(const std::vector<MonitoredWorker>& workers, int store_port = 0);
  void SetPid(int local_rank, pid_t pid);
  void SetState(int local_rank, const std::string& state);

  // One sample of every worker: channel, CPU % since the previous sample
  // (the worker's process group: its DataLoader workers and other children
  // included), RSS (the group's sum), GPU. `warnings` receives one line per
  // new problem ("rank 3: the metrics channel's header was overwritten").
  std::vector<rendezvous::RankSample> Sample(std::vector<std::string>* warnings);

  // The last channel snapshot of a local rank (stack capture needs its
  // owner pid and signal); nullopt before the first good read.
  std::optional<rendezvous::ChannelSnapshot> LastChannel(int local_rank) const;

 private:
  struct State {
    MonitoredWorker w;
    std::unique_ptr<rendezvous::ChannelReader> reader;
    std::optional<rendezvous::ChannelSnapshot> last;
    bool channel_broken = false;
    std::map<pid_t, std::uint64_t> ticks;  // the group's processes at the previous sample
    rendezvous::TimePoint sampled_at{};
    bool reached_store = false;
  };
  ProcSource& proc_;
  GpuSource& gpu_;
  const rendezvous::Clock& clock_;
  std::vector<State> workers_;
  int store_port_ = 0;
};

}  // namespace ddprun::agent
