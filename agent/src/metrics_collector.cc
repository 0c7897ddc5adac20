// MetricsCollector (metrics_collector.h): channels, /proc and NVML into
// RankSamples.
#include "ddprun/agent/metrics_collector.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace ddprun::agent {

namespace rdzv = ::ddprun::rendezvous;

MetricsCollector::MetricsCollector(ProcSource& proc, GpuSource& gpu, const rdzv::Clock& clock)
    : proc_(proc), gpu_(gpu), clock_(clock) {}

void MetricsCollector::Reset(const std::vector<MonitoredWorker>& workers, int store_port) {
  workers_.clear();
  store_port_ = store_port;
  for (const MonitoredWorker& w : workers) {
    State s;
    s.w = w;
    if (w.channel_fd >= 0) s.reader = std::make_unique<rdzv::ChannelReader>(w.channel_fd);
    workers_.push_back(std::move(s));
  }
}

void MetricsCollector::SetPid(int local_rank, pid_t pid) {
  for (State& s : workers_) {
    if (s.w.local_rank == local_rank) s.w.pid = pid;
  }
}

void MetricsCollector::SetState(int local_rank, const std::string& state) {
  for (State& s : workers_) {
    if (s.w.local_rank == local_rank) s.w.state = state;
  }
}

std::optional<rdzv::ChannelSnapshot> MetricsCollector::LastChannel(int local_rank) const {
  for (const State& s : workers_) {
    if (s.w.local_rank == local_rank) return s.last;
  }
  return std::nullopt;
}

std::vector<rdzv::RankSample> MetricsCollector::Sample(std::vector<std::string>* warnings) {
  const rdzv::TimePoint now = clock_.Now();
  // One pass over /proc for every worker: the processes of each worker's
  // group (workers are process group leaders, pgid == pid).
  std::map<pid_t, std::vector<ProcStat>> groups;
  bool any_pid = false;
  for (const State& s : workers_) any_pid = any_pid || s.w.pid > 0;
  if (any_pid) {
    std::set<pid_t> leaders;
    for (const State& s : workers_) {
      if (s.w.pid > 0) leaders.insert(s.w.pid);
    }
    for (const ProcStat& p : proc_.Scan()) {
      if (leaders.count(p.pgid) != 0) {
        groups[p.pgid].push_back(p);
      } else if (leaders.count(p.pid) != 0) {
        groups[p.pid].push_back(p);  // a worker that left its own group
      }
    }
  }
  const double hz = std::max(1.0, proc_.ticks_per_second());

  std::vector<rdzv::RankSample> out;
  for (State& s : workers_) {
    rdzv::RankSample r;
    r.rank = s.w.rank;
    r.local_rank = s.w.local_rank;
    r.pid = s.w.pid;
    r.state = s.w.state;

    if (s.reader && !s.channel_broken) {
      auto snap = s.reader->Read();
      if (snap.ok()) {
        s.last = *snap;
      } else {
        s.channel_broken = true;  // reported once; the worker broke it
        if (warnings) {
          warnings->push_back(absl::StrCat("rank ", s.w.rank, ": ", snap.status().message(),
                                           "; its metrics are ignored from now on"));
        }
      }
      if (warnings) {
        for (std::string& w : s.reader->TakeWarnings()) {
          warnings->push_back(absl::StrCat("rank ", s.w.rank, ": ", w));
        }
      }
    }
    if (s.last && !s.channel_broken) {
      const rdzv::ChannelSnapshot& c = *s.last;
      r.has_progress_source = (c.flags & rdzv::kChannelFlagProgress) != 0;
      r.steps = c.steps;
      r.step_seconds = c.new_step_seconds;
      r.samples_total = c.samples_total;
      r.collective_seq = c.collective_seq;
      r.in_collective = c.in_collective;
      r.collective_op = c.collective_op;
      r.comm_seconds_total = c.comm_seconds_total;
      for (const auto& op : c.ops) {
        r.collectives.push_back({op.op, op.count, op.bytes_total, op.seconds_total, op.busbw_gbps});
      }
      r.scalars = c.scalars;
      r.scalars_dropped = c.scalars_dropped;
      s.last->new_step_seconds.clear();  // reported once
    }

    // CPU and memory of the worker's process group.
    std::map<pid_t, std::uint64_t> ticks;
    std::uint64_t delta = 0;
    std::set<pid_t> pids;
    if (auto it = groups.find(s.w.pid); it != groups.end()) {
      for (const ProcStat& p : it->second) {
        ticks[p.pid] = p.cpu_ticks;
        pids.insert(p.pid);
        r.rss_bytes += p.rss_bytes;
        auto prev = s.ticks.find(p.pid);
        // A process new since the last sample started within the interval.
        const std::uint64_t before = prev == s.ticks.end() ? 0 : prev->second;
        if (p.cpu_ticks >= before) delta += p.cpu_ticks - before;
      }
    }
    if (s.sampled_at != rdzv::TimePoint{} && now > s.sampled_at) {
      const double wall = std::chrono::duration<double>(now - s.sampled_at).count();
      r.cpu_percent = 100.0 * static_cast<double>(delta) / hz / wall;
    }
    s.ticks = std::move(ticks);
    s.sampled_at = now;

    // Whether the worker reached init_process_group: a process of its group
    // connected to the round's store. Looked for until found (sticky).
    if (!s.reached_store && store_port_ > 0) {
      for (pid_t pid : pids) {
        if (proc_.ConnectedToPort(pid, store_port_)) {
          s.reached_store = true;
          break;
        }
      }
    }
    r.reached_store = s.reached_store;

    const GpuUse gpu = pids.empty() ? GpuUse{} : gpu_.Sample(pids);
    r.gpu_util_percent = gpu.util_percent;
    r.gpu_mem_bytes = gpu.util_percent >= 0 ? gpu.mem_bytes : 0;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ddprun::agent
