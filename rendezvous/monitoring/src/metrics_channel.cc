// The metrics channel's writer and reader (metrics_channel.h).
#include "ddprun/rendezvous/monitoring/metrics_channel.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddprun::rendezvous {
namespace {

// How often the reader re-copies a section that a writer is changing.
constexpr int kReadTries = 4;
// Bounds on what a sane writer reports; anything else is garbage.
constexpr double kMaxStepSeconds = 7 * 24 * 3600.0;
constexpr double kMaxSamples = 1e18;

std::atomic_ref<std::uint64_t> Seq(std::uint64_t& s) { return std::atomic_ref<std::uint64_t>(s); }

// A seqlock write: odd while the section changes.
class SeqWrite {
 public:
  explicit SeqWrite(std::uint64_t& seq) : seq_(seq) {
    const std::uint64_t s = Seq(seq_).load(std::memory_order_relaxed);
    Seq(seq_).store(s | 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~SeqWrite() {
    const std::uint64_t s = Seq(seq_).load(std::memory_order_relaxed);
    Seq(seq_).store((s | 1) + 1, std::memory_order_release);
  }

 private:
  std::uint64_t& seq_;
};

void CopyName(char* dst, std::size_t cap, std::string_view name) {
  const std::size_t n = std::min(name.size(), cap - 1);
  std::memcpy(dst, name.data(), n);
  std::memset(dst + n, 0, cap - n);
}

// A NUL-terminated printable name within `cap` bytes, or nullopt.
std::optional<std::string> NameIn(const char* field, std::size_t cap) {
  const void* nul = std::memchr(field, 0, cap);
  if (nul == nullptr) return std::nullopt;
  std::string name(field, static_cast<const char*>(nul) - field);
  if (!ValidChannelName(name)) return std::nullopt;
  return name;
}

bool PreadAll(int fd, void* buf, std::size_t n, off_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    off += r;
  }
  return true;
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

std::string InitialChannelBytes() {
  ChannelLayout layout;
  std::memset(&layout, 0, sizeof(layout));
  std::memcpy(layout.header.magic, kChannelMagic, sizeof(kChannelMagic));
  layout.header.version = kChannelVersion;
  layout.header.size = sizeof(ChannelLayout);
  layout.progress.samples_total = -1;
  for (double& d : layout.progress.step_seconds) d = std::nan("");
  return std::string(reinterpret_cast<const char*>(&layout), sizeof(layout));
}

bool ValidChannelName(std::string_view name) {
  if (name.empty() || name.size() >= static_cast<std::size_t>(kChannelScalarNameBytes)) {
    return false;
  }
  for (char c : name) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// ------------------------------------------------------------------ writer

absl::StatusOr<std::unique_ptr<ChannelWriter>> ChannelWriter::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open the metrics channel ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(ChannelLayout))) {
    map = ::mmap(nullptr, sizeof(ChannelLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("the metrics channel ", path, " is too small or cannot be mapped"));
  }
  auto* layout = static_cast<ChannelLayout*>(map);
  if (std::memcmp(layout->header.magic, kChannelMagic, sizeof(kChannelMagic)) != 0 ||
      layout->header.version != kChannelVersion || layout->header.size != sizeof(ChannelLayout)) {
    ::munmap(map, sizeof(ChannelLayout));
    return absl::FailedPreconditionError(absl::StrCat(
        "the metrics channel ", path, " has another layout (a different ddprun version)"));
  }
  std::int64_t expected = 0;
  const std::int64_t me = ::getpid();
  std::atomic_ref<std::int64_t> owner(layout->header.owner_pid);
  // A previous owner that exited (a wrapper script's first Python) leaves
  // the channel to the next process of the worker.
  if (!owner.compare_exchange_strong(expected, me) && expected != me &&
      !(::kill(static_cast<pid_t>(expected), 0) != 0 && errno == ESRCH &&
        owner.compare_exchange_strong(expected, me))) {
    ::munmap(map, sizeof(ChannelLayout));
    return absl::AlreadyExistsError(
        absl::StrCat("the metrics channel ", path, " belongs to process ", expected));
  }
  return std::unique_ptr<ChannelWriter>(new ChannelWriter(layout));
}

ChannelWriter::ChannelWriter(ChannelLayout* map) : map_(map) {}

ChannelWriter::~ChannelWriter() { ::munmap(map_, sizeof(ChannelLayout)); }

void ChannelWriter::AddFlags(std::uint32_t flags) {
  std::atomic_ref<std::uint32_t>(map_->header.flags).fetch_or(flags, std::memory_order_relaxed);
}

void ChannelWriter::Step(double samples, double seconds) {
  std::uint32_t flags = kChannelFlagProgress;
  if (samples >= 0) flags |= kChannelFlagSamples;
  if ((map_->header.flags & flags) != flags) AddFlags(flags);
  std::lock_guard<std::mutex> lock(progress_mu_);
  SeqWrite w(map_->header.progress_seq);
  ProgressSection& p = map_->progress;
  p.steps += 1;
  p.step_seconds[(p.steps - 1) % kChannelStepRing] = seconds;
  if (samples >= 0) p.samples_total = (p.samples_total < 0 ? 0 : p.samples_total) + samples;
}

bool ChannelWriter::Scalar(std::string_view name, double value) {
  std::lock_guard<std::mutex> lock(scalars_mu_);
  ScalarsSection& s = map_->scalars;
  int slot = -1;
  if (auto it = scalar_slots_.find(std::string(name)); it != scalar_slots_.end()) {
    slot = it->second;
  } else if (ValidChannelName(name) && s.count < static_cast<std::uint32_t>(kChannelMaxScalars)) {
    slot = static_cast<int>(s.count);
    scalar_slots_.emplace(std::string(name), slot);
    SeqWrite w(map_->header.scalars_seq);
    CopyName(s.slots[slot].name, sizeof(s.slots[slot].name), name);
    s.slots[slot].value = value;
    s.count += 1;
    return true;
  }
  SeqWrite w(map_->header.scalars_seq);
  if (slot < 0) {
    s.dropped += 1;
    return false;
  }
  s.slots[slot].value = value;
  return true;
}

int ChannelWriter::OpIndex(std::string_view op) {
  CommSection& c = map_->comm;
  for (std::uint32_t i = 0; i < c.num_ops; ++i) {
    if (std::string_view(c.ops[i].op) == op) return static_cast<int>(i);
  }
  if (c.num_ops >= static_cast<std::uint32_t>(kChannelMaxOps)) return -1;
  const int i = static_cast<int>(c.num_ops);
  std::memset(&c.ops[i], 0, sizeof(c.ops[i]));
  CopyName(c.ops[i].op, sizeof(c.ops[i].op), op);
  c.num_ops += 1;
  return i;
}

void ChannelWriter::CollectiveStart(std::string_view op) {
  if ((map_->header.flags & kChannelFlagCollectives) == 0) AddFlags(kChannelFlagCollectives);
  std::lock_guard<std::mutex> lock(comm_mu_);
  SeqWrite w(map_->header.comm_seq);
  CommSection& c = map_->comm;
  const int i = OpIndex(op);
  c.collective_seq += 1;
  c.in_collective = 1;
  c.current_op = i < 0 ? 0 : static_cast<std::uint32_t>(i);
}

void ChannelWriter::CollectiveEnd(std::string_view op, std::int64_t bytes, double seconds,
                                  double busbw_gbps, bool more_in_flight) {
  std::lock_guard<std::mutex> lock(comm_mu_);
  SeqWrite w(map_->header.comm_seq);
  CommSection& c = map_->comm;
  c.in_collective = more_in_flight ? 1 : 0;
  c.comm_seconds_total += seconds;
  const int i = OpIndex(op);
  if (i < 0) return;
  c.ops[i].count += 1;
  c.ops[i].bytes_total += bytes;
  c.ops[i].seconds_total += seconds;
  c.ops[i].busbw_gbps = busbw_gbps;
}

// ------------------------------------------------------------------ reader

std::vector<std::string> ChannelReader::TakeWarnings() {
  std::vector<std::string> out;
  out.swap(warnings_);
  return out;
}

absl::StatusOr<ChannelSnapshot> ChannelReader::Read() {
  ChannelHeader before{}, after{};
  ProgressSection progress{};
  CommSection comm{};
  auto scalars = std::make_unique<ScalarsSection>();
  bool progress_ok = false, comm_ok = false, scalars_ok = false;
  for (int attempt = 0; attempt < kReadTries && !(progress_ok && comm_ok && scalars_ok);
       ++attempt) {
    if (!PreadAll(fd_, &before, sizeof(before), 0)) {
      return absl::DataLossError("the metrics channel was truncated");
    }
    if (std::memcmp(before.magic, kChannelMagic, sizeof(kChannelMagic)) != 0 ||
        before.version != kChannelVersion || before.size != sizeof(ChannelLayout)) {
      return absl::DataLossError("the metrics channel's header was overwritten");
    }
    bool short_read = false;
    auto read_section = [&](bool done, std::uint64_t seq, void* buf, std::size_t n, off_t off) {
      if (done || (seq & 1) != 0) return false;
      if (PreadAll(fd_, buf, n, off)) return true;
      short_read = true;
      return false;
    };
    const bool read_p = read_section(progress_ok, before.progress_seq, &progress, sizeof(progress),
                                     offsetof(ChannelLayout, progress));
    const bool read_c =
        read_section(comm_ok, before.comm_seq, &comm, sizeof(comm), offsetof(ChannelLayout, comm));
    const bool read_s = read_section(scalars_ok, before.scalars_seq, scalars.get(),
                                     sizeof(ScalarsSection), offsetof(ChannelLayout, scalars));
    if (short_read) return absl::DataLossError("the metrics channel was truncated");
    if (!PreadAll(fd_, &after, sizeof(after), 0)) {
      return absl::DataLossError("the metrics channel was truncated");
    }
    progress_ok = progress_ok || (read_p && after.progress_seq == before.progress_seq);
    comm_ok = comm_ok || (read_c && after.comm_seq == before.comm_seq);
    scalars_ok = scalars_ok || (read_s && after.scalars_seq == before.scalars_seq);
  }

  ChannelSnapshot snap = last_;
  snap.new_step_seconds.clear();
  snap.owner_pid = after.owner_pid > 0 ? after.owner_pid : 0;
  snap.flags = after.flags & (kChannelFlagProgress | kChannelFlagHook | kChannelFlagCollectives |
                              kChannelFlagSamples);
  snap.stack_signal = after.stack_signal > 0 && after.stack_signal < 65 ? after.stack_signal : 0;

  if (progress_ok) {
    if (progress.steps < last_.steps) {
      if (!warned_steps_) {
        warnings_.push_back(absl::StrCat("steps went backwards (", last_.steps, " -> ",
                                         progress.steps, "); the lower count is ignored"));
        warned_steps_ = true;
      }
    } else {
      snap.steps = progress.steps;
      // Durations of the steps since the previous read, at most one ring.
      const std::int64_t from =
          std::max<std::int64_t>(last_steps_reported_, snap.steps - kChannelStepRing);
      for (std::int64_t n = from + 1; n <= snap.steps; ++n) {
        const double s = progress.step_seconds[(n - 1) % kChannelStepRing];
        if (Finite(s) && s >= 0 && s <= kMaxStepSeconds) snap.new_step_seconds.push_back(s);
      }
      last_steps_reported_ = snap.steps;
    }
    const double samples = progress.samples_total;
    if (Finite(samples) && samples >= 0 && samples <= kMaxSamples &&
        samples >= last_.samples_total) {
      snap.samples_total = samples;
    }
  }
  if (comm_ok) {
    if (comm.collective_seq < last_.collective_seq) {
      if (!warned_seq_) {
        warnings_.push_back(absl::StrCat("the collective count went backwards (",
                                         last_.collective_seq, " -> ", comm.collective_seq,
                                         "); the lower count is ignored"));
        warned_seq_ = true;
      }
    } else {
      snap.collective_seq = comm.collective_seq;
      if (Finite(comm.comm_seconds_total) && comm.comm_seconds_total >= 0) {
        snap.comm_seconds_total = comm.comm_seconds_total;
      }
      snap.ops.clear();
      const std::uint32_t n = std::min<std::uint32_t>(comm.num_ops, kChannelMaxOps);
      for (std::uint32_t i = 0; i < n; ++i) {
        const ChannelOpStat& o = comm.ops[i];
        std::optional<std::string> name = NameIn(o.op, sizeof(o.op));
        if (!name || o.count < 0 || o.bytes_total < 0 || !Finite(o.seconds_total) ||
            o.seconds_total < 0 || !Finite(o.busbw_gbps) || o.busbw_gbps < 0) {
          continue;
        }
        snap.ops.push_back({*name, o.count, o.bytes_total, o.seconds_total, o.busbw_gbps});
      }
      snap.in_collective = comm.in_collective == 1;
      snap.collective_op.clear();
      if (snap.in_collective && comm.current_op < n) {
        snap.collective_op =
            NameIn(comm.ops[comm.current_op].op, kChannelOpNameBytes).value_or(std::string());
      }
    }
  }
  if (scalars_ok) {
    snap.scalars.clear();
    std::int64_t invalid = 0;
    const std::uint32_t n = std::min<std::uint32_t>(scalars->count, kChannelMaxScalars);
    for (std::uint32_t i = 0; i < n; ++i) {
      const ChannelScalar& s = scalars->slots[i];
      std::optional<std::string> name = NameIn(s.name, sizeof(s.name));
      if (!name || !Finite(s.value)) {
        ++invalid;
        continue;
      }
      snap.scalars[*name] = s.value;
    }
    snap.scalars_dropped = std::max<std::int64_t>(0, scalars->dropped) + invalid;
  }
  last_ = snap;
  return snap;
}

}  // namespace ddprun::rendezvous
