#include "ddprun/agent/checkpoint_persister.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ddprun/agent/background_priority.h"
#include "ddprun/agent/bandwidth_limit.h"
#include "ddprun/agent/checkpoint_file.h"
#include "nlohmann/json.hpp"
#include "zlib.h"

namespace ddprun::agent {
namespace {

using Json = nlohmann::json;

constexpr const char* kManifestFormat = "ddprun-checkpoint-1";
constexpr std::size_t kChunk = 64 << 20;  // bytes per write(2), between cancel checks
// Under --ckpt_bandwidth: bytes per write(2), each after its time at the rate.
constexpr std::size_t kPacedChunk = 4 << 20;

std::string StepDir(const std::string& dir, std::int64_t step) {
  return absl::StrCat(dir, "/step-", step);
}
std::string RankFile(int rank) { return absl::StrFormat("rank-%05d.safetensors", rank); }

struct RankEntry {
  std::string file;
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
};
struct StepInfo {
  int world_size = -1;
  std::map<int, RankEntry> ranks;
  bool Complete() const {
    if (world_size <= 0) return false;
    for (int r = 0; r < world_size; ++r) {
      if (!ranks.contains(r)) return false;
    }
    return true;
  }
};

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool ParseStepName(const std::string& name, std::int64_t* step) {
  return absl::StartsWith(name, "step-") && absl::SimpleAtoi(name.substr(5), step) &&
         name == absl::StrCat("step-", *step);
}

bool ReadWhole(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = std::move(s).str();
  return !in.bad();
}

// What the manifests in DIR/step-<step> say (only that folder's files are
// read). Problems (a manifest that does not parse, an entry that is not
// ddprun's) are named in *problems, one line each.
StepInfo ScanStep(const std::string& dir, std::int64_t step, std::vector<std::string>* problems) {
  StepInfo info;
  const std::string name = absl::StrCat("step-", step);
  for (const std::string& file : List(absl::StrCat(dir, "/", name))) {
    if (!absl::StartsWith(file, "manifest-") || !absl::EndsWith(file, ".json")) continue;
    const std::string path = absl::StrCat(dir, "/", name, "/", file);
    std::string text;
    Json m = ReadWhole(path, &text) ? Json::parse(text, nullptr, false) : Json();
    bool ok = m.is_object() && m.value("format", "") == kManifestFormat && m.contains("step") &&
              m["step"].is_number_integer() && m["step"].get<std::int64_t>() == step &&
              m.contains("world_size") && m["world_size"].is_number_integer() &&
              m.contains("ranks") && m["ranks"].is_object();
    const int world = ok ? m["world_size"].get<int>() : -1;
    ok = ok && world > 0 && (info.world_size < 0 || info.world_size == world);
    std::map<int, RankEntry> ranks;
    if (ok) {
      for (const auto& [key, e] : m["ranks"].items()) {
        int r = -1;
        if (!absl::SimpleAtoi(key, &r) || r < 0 || r >= world || !e.is_object() ||
            !e.contains("file") || !e["file"].is_string() || !e.contains("size") ||
            !e["size"].is_number_unsigned() || !e.contains("crc32") ||
            !e["crc32"].is_number_unsigned() || e["file"].get<std::string>() != RankFile(r)) {
          ok = false;
          break;
        }
        ranks[r] = {e["file"].get<std::string>(), e["size"].get<std::uint64_t>(),
                    e["crc32"].get<std::uint32_t>()};
      }
    }
    if (!ok) {
      if (problems) {
        problems->push_back(absl::StrCat("refusing ", path, ": not a ddprun manifest of step ",
                                         step, " (format \"", kManifestFormat,
                                         "\", world_size, ranks)"));
      }
      continue;
    }
    info.world_size = world;
    info.ranks.merge(ranks);
  }
  return info;
}

// The step folders of DIR and what their manifests say (ScanStep), with
// what is not a step folder named in *problems.
std::map<std::int64_t, StepInfo> ScanDir(const std::string& dir,
                                         std::vector<std::string>* problems) {
  std::map<std::int64_t, StepInfo> steps;
  for (const std::string& name : List(dir)) {
    std::int64_t step = 0;
    if (name[0] == '.') continue;  // a temporary file
    if (!ParseStepName(name, &step)) {
      if (problems) {
        problems->push_back(
            absl::StrCat("ignoring ", dir, "/", name, ": not a step folder of ddprun (step-<N>)"));
      }
      continue;
    }
    steps[step] = ScanStep(dir, step, problems);
  }
  return steps;
}

// The step numbers of DIR's step folders, oldest first; nothing is read.
std::vector<std::int64_t> StepFolders(const std::string& dir) {
  std::vector<std::int64_t> steps;
  for (const std::string& name : List(dir)) {
    std::int64_t step = 0;
    if (ParseStepName(name, &step)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Writes `head` then the pieces of `bytes` to `path` through a temporary
// file: fsync, rename, fsync of the folder, each write after its time at
// `pace` (null: at once, in larger writes). *crc and *size describe what was written. An
// error names the path and the cause; nothing is left.
absl::Status WriteAtomically(const std::string& folder, const std::string& name,
                             const std::string& head, const std::string& bytes,
                             const std::vector<CheckpointFilePlan::Piece>& pieces,
                             const std::atomic<bool>& cancel, BandwidthLimit* pace,
                             std::uint32_t* crc, std::uint64_t* size) {
  const std::string path = absl::StrCat(folder, "/", name);
  const std::string tmp = absl::StrCat(folder, "/.", name, ".tmp-", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(err)));
  };
  uLong c = ::crc32_z(0, nullptr, 0);
  std::uint64_t written = 0;
  auto put = [&](const char* p, std::size_t n) -> bool {
    while (n > 0) {
      if (cancel.load()) {
        errno = ECANCELED;
        return false;
      }
      const std::size_t len = std::min(n, pace != nullptr ? kPacedChunk : kChunk);
      if (pace != nullptr) pace->Take(len);
      const ssize_t w = ::write(fd, p, len);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = EIO;
        return false;
      }
      c = ::crc32_z(c, reinterpret_cast<const Bytef*>(p), static_cast<std::size_t>(w));
      p += w;
      n -= static_cast<std::size_t>(w);
      written += static_cast<std::uint64_t>(w);
    }
    return true;
  };
  if (!put(head.data(), head.size())) return fail("writing");
  for (const auto& piece : pieces) {
    if (!put(bytes.data() + piece.offset, piece.size)) return fail("writing");
  }
  if (::fsync(fd) != 0) return fail("syncing");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("closing ", path, ": ", std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("renaming to ", path, ": ", std::strerror(err)));
  }
  if (const int d = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
  *crc = static_cast<std::uint32_t>(c);
  *size = written;
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
    errno = ENOTDIR;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--ckpt_dir: cannot create ", path, ": ", std::strerror(errno),
                   "; give a directory ddprun can write (or leave --ckpt_dir out)"));
}

}  // namespace

CheckpointPersister::CheckpointPersister(std::string dir, const CheckpointMemory* memory, LogFn log,
                                         std::uint64_t bandwidth, BackgroundThreads* background)
    : dir_(std::move(dir)),
      memory_(memory),
      log_(std::move(log)),
      background_(background),
      pace_(bandwidth) {}

CheckpointPersister::~CheckpointPersister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cancel_ = true;
  pace_.Lift(true);  // a paced write's sleep ends at its next chunk
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status CheckpointPersister::Start() {
  if (absl::Status st = MakeDir(dir_); !st.ok()) return st;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void CheckpointPersister::Loop() {
  const BackgroundThreads::Member member(background_, kPersistThreadName);
  LowerThreadPriority();  // background_priority.h: a flush, which the job waits for, asks for 0
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPollInterval,
                 [this] { return stop_ || flush_requests_ > requests_served_; });
    if (stop_) break;
    const std::uint64_t request = flush_requests_;
    const bool flushing = request > requests_served_;
    lock.unlock();
    cancel_ = false;
    const bool raised = flushing && RestoreThreadPriority();
    Outcome o = PersistNewest(flushing);
    // A slot saved over while read: a flush tries again at once.
    for (int i = 0; flushing && o == Outcome::kRetry && i < 100 && !cancel_.load(); ++i) {
      o = PersistNewest(flushing);
    }
    if (raised) LowerThreadPriority();
    lock.lock();
    if (flushing) {
      requests_served_ = request;
      if (flush_requests_ == requests_served_) pace_.Lift(false);
      last_outcome_ = o;
      cv_.notify_all();
    }
  }
}

CheckpointPersister::Outcome CheckpointPersister::PersistNewest(bool flushing) {
  const int n = memory_->size();
  if (n == 0) return Outcome::kNothing;
  std::vector<std::vector<CommittedSnapshot>> committed(static_cast<std::size_t>(n));
  std::set<std::int64_t> common;
  for (int j = 0; j < n; ++j) {
    committed[j] = memory_->Committed(j);
    std::set<std::int64_t> mine;
    for (const CommittedSnapshot& s : committed[j]) mine.insert(s.step);
    if (j == 0) {
      common = std::move(mine);
    } else {
      std::set<std::int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.end()));
      common = std::move(both);
    }
  }
  if (common.empty()) return Outcome::kNothing;
  const std::int64_t step = *common.rbegin();
  if (step == persisted_step_.load()) return Outcome::kNothing;
  if (step == failed_step_ && !flushing) return Outcome::kFailed;
  const std::string folder = StepDir(dir_, step);
  auto failed = [&](const std::string& why) {
    failed_step_ = step;
    ::rmdir(folder.c_str());  // when empty: no folder of a step never written
    if (!failing_) {
      log_(absl::StrCat("--ckpt_dir: cannot persist step ", step, ": ", why,
                        "; the snapshot stays in memory and the job goes on (said once until a "
                        "write succeeds)"));
    }
    failing_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    last_failure_ = why;
    return Outcome::kFailed;
  };
  if (absl::Status st = MakeDir(folder); !st.ok()) return failed(std::string(st.message()));
  Json ranks = Json::object();
  int first = INT32_MAX, last = -1, world = 0;
  for (int j = 0; j < n; ++j) {
    const auto it = std::find_if(committed[j].begin(), committed[j].end(),
                                 [step](const CommittedSnapshot& s) { return s.step == step; });
    absl::StatusOr<std::string> bytes = memory_->ReadCommitted(j, *it, std::move(buffer_));
    if (absl::IsUnavailable(bytes.status())) return Outcome::kRetry;
    if (!bytes.ok()) return failed(std::string(bytes.status().message()));
    absl::StatusOr<CheckpointFilePlan> plan =
        PlanCheckpointFile(*bytes, step, it->rank, it->world_size);
    if (!plan.ok()) {
      return failed(absl::StrCat("the snapshot of rank ", it->rank, " does not parse (",
                                 plan.status().message(), ")"));
    }
    std::uint32_t crc = 0;
    std::uint64_t size = 0;
    const std::string name = RankFile(it->rank);
    if (absl::Status st = WriteAtomically(folder, name, plan->head, *bytes, plan->pieces, cancel_,
                                          &pace_, &crc, &size);
        !st.ok()) {
      return failed(std::string(st.message()));
    }
    ranks[std::to_string(it->rank)] = {{"file", name}, {"size", size}, {"crc32", crc}};
    buffer_ = *std::move(bytes);  // the next rank's or step's snapshot is read into it
    first = std::min(first, it->rank);
    last = std::max(last, it->rank);
    world = it->world_size;
  }
  const Json manifest = {
      {"format", kManifestFormat}, {"step", step}, {"world_size", world}, {"ranks", ranks}};
  const std::string text = manifest.dump(1) + "\n";
  std::uint32_t crc = 0;
  std::uint64_t size = 0;
  if (absl::Status st =
          WriteAtomically(folder, absl::StrCat("manifest-", first, "-", last, ".json"), text, "",
                          {}, cancel_, nullptr, &crc, &size);
      !st.ok()) {
    return failed(std::string(st.message()));
  }
  persisted_step_ = step;
  failed_step_ = kNone;
  if (failing_) log_(absl::StrCat("--ckpt_dir: step ", step, " persisted to ", dir_));
  failing_ = false;
  // Only this step's manifests are read (every node's, to know whether the
  // step is complete): the files of other steps are never read here.
  if (ScanStep(dir_, step, nullptr).Complete()) Prune(step);
  // This node's own files beyond its last two steps go too, so a directory
  // no other node writes to (no step ever complete) does not grow.
  if (previous_written_ != kNone && previous_written_ < step) {
    for (const std::int64_t old : StepFolders(dir_)) {
      if (old >= previous_written_) break;
      const std::string old_folder = StepDir(dir_, old);
      for (int r = first; r <= last; ++r)
        ::unlink(absl::StrCat(old_folder, "/", RankFile(r)).c_str());
      ::unlink(absl::StrCat(old_folder, "/manifest-", first, "-", last, ".json").c_str());
      ::rmdir(old_folder.c_str());
    }
  }
  previous_written_ = step;
  return Outcome::kWritten;
}

void CheckpointPersister::Prune(std::int64_t complete_step) {
  for (const std::string& name : List(dir_)) {
    std::int64_t step = 0;
    if (!ParseStepName(name, &step) || step >= complete_step) continue;
    const std::string folder = absl::StrCat(dir_, "/", name);
    for (const std::string& file : List(folder)) {
      const bool ours = (absl::StartsWith(file, "rank-") && absl::EndsWith(file, ".safetensors")) ||
                        (absl::StartsWith(file, "manifest-") && absl::EndsWith(file, ".json")) ||
                        absl::StrContains(file, ".tmp-");
      if (ours) ::unlink(absl::StrCat(folder, "/", file).c_str());
    }
    ::rmdir(folder.c_str());  // fails, and stays, when something else is in it
  }
}

void CheckpointPersister::RequestFlush() {
  std::lock_guard<std::mutex> lock(mu_);
  ++flush_requests_;
  pace_.Lift(true);  // a background write in progress finishes at full speed
  cv_.notify_all();
}

void CheckpointPersister::Flush(Clock::time_point deadline, const std::string& why) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!thread_.joinable()) return;
  const std::uint64_t request = ++flush_requests_;
  pace_.Lift(true);  // a background write in progress finishes at full speed
  cv_.notify_all();
  if (!cv_.wait_until(lock, deadline, [&] { return requests_served_ >= request || stop_; })) {
    cancel_ = true;
    const std::int64_t kept = persisted_step_.load();
    lock.unlock();
    log_(absl::StrCat(
        "--ckpt_dir: persisting the newest step did not finish in time (", why, "); ", dir_,
        kept == kNone ? " holds no step of this job" : absl::StrCat(" keeps step ", kept)));
    return;
  }
  const Outcome o = last_outcome_;
  const std::string failure = last_failure_;
  const std::int64_t step = persisted_step_.load();
  lock.unlock();
  if (o == Outcome::kFailed) {
    log_(absl::StrCat(
        "--ckpt_dir: the newest step is not persisted (", why, "): ", failure, "; ", dir_,
        step == kNone ? " holds no step of this job" : absl::StrCat(" keeps step ", step)));
    return;
  }
  if (step != kNone && step != reported_step_) {
    reported_step_ = step;
    log_(absl::StrCat("--ckpt_dir: step ", step, " is persisted in ", dir_, " (", why, ")"));
  }
}

void CheckpointPersister::Restore(CheckpointMemory* memory, int local_ranks, int base_rank,
                                  int world_size) {
  std::vector<std::string> problems;
  const std::map<std::int64_t, StepInfo> steps = ScanDir(dir_, &problems);
  for (const std::string& p : problems) log_(absl::StrCat("--ckpt_dir: ", p));
  bool refused = false;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto& [step, info] = *it;
    if (!info.Complete()) continue;
    if (info.world_size != world_size) {
      log_(absl::StrCat("--ckpt_dir: not resuming from step ", step, " in ", dir_,
                        ": it was saved by ", info.world_size, " ranks, this job has ",
                        world_size));
      continue;
    }
    std::vector<LoadedCheckpoint> loaded;
    for (int j = 0; j < local_ranks; ++j) {
      const int rank = base_rank + j;
      const RankEntry& e = info.ranks.at(rank);
      const std::string path = absl::StrCat(StepDir(dir_, step), "/", e.file);
      std::string file;
      std::string why;
      if (!ReadWhole(path, &file)) {
        why = absl::StrCat("cannot read it: ", std::strerror(errno));
      } else if (file.size() != e.size) {
        why = absl::StrCat("it has ", file.size(), " bytes, its manifest says ", e.size);
      } else if (const auto crc = static_cast<std::uint32_t>(
                     ::crc32_z(0, reinterpret_cast<const Bytef*>(file.data()), file.size()));
                 crc != e.crc) {
        why = absl::StrFormat("its CRC-32 is %08x, its manifest says %08x (a corrupt file)", crc,
                              e.crc);
      } else if (absl::StatusOr<LoadedCheckpoint> c = ParseCheckpointFile(file); !c.ok()) {
        why = std::string(c.status().message());
      } else if (c->step != step || c->rank != rank || c->world_size != world_size) {
        why = absl::StrCat("it holds step ", c->step, " of rank ", c->rank, " of ", c->world_size,
                           " (a foreign file)");
      } else {
        loaded.push_back(*std::move(c));
        continue;
      }
      log_(absl::StrCat("--ckpt_dir: refusing ", path, ": ", why));
      refused = true;
      break;
    }
    if (static_cast<int>(loaded.size()) != local_ranks) continue;
    for (int j = 0; j < local_ranks; ++j) {
      if (absl::Status st = memory->Seed(j, step, base_rank + j, world_size, loaded[j].snapshot);
          !st.ok()) {
        log_(absl::StrCat("--ckpt_dir: cannot resume from step ", step, " in ", dir_, ": ",
                          st.message(), "; starting fresh"));
        for (int k = 0; k <= j; ++k) memory->Clear(k);
        return;
      }
    }
    persisted_step_ = step;
    log_(absl::StrCat("--ckpt_dir: resuming from step ", step, " in ", dir_,
                      refused ? " (an older complete step)" : ""));
    return;
  }
  if (refused || !steps.empty()) {
    log_(absl::StrCat("--ckpt_dir: no complete step in ", dir_,
                      " that this job can load; starting fresh"));
  }
}

}  // namespace ddprun::agent
