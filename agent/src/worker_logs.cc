#include "ddprun/agent/worker_logs.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ddprun/agent/agent_options.h"
#include "ddprun/rendezvous/common/status_macros.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// How long a drain may take before the agent moves on (a console that does
// not read blocks the pump, never the agent for longer than this).
constexpr milliseconds kSyncTimeout(2000);
// The stderr tail travels in every report: at most this many bytes.
constexpr std::size_t kMaxTailBytes = 4096;
// Where a temporary directory of error files only goes when TMPDIR is unset.
constexpr const char* kTmpfsDir = "/dev/shm";

// A temporary directory is "ddprun_<pid>_XXXXXX" (the agent's pid), so that
// one left behind can be told from a live agent's.
std::string TempTemplate(const std::string& parent) {
  return absl::StrCat(parent, "/ddprun_", ::getpid(), "_XXXXXX");
}

// What an agent that died before it could clean up left in `parent` (one
// killed with SIGKILL whose guard could not remove it, or killed between the
// directory's creation and the guard's taking it over): every
// "ddprun_<pid>_XXXXXX" whose pid no longer runs, when it is empty or holds
// only the flat layout's error files. Anything else in it (logs, a user's
// file) keeps it. Best effort: errors leave the directory as it is.
void SweepStaleTempDirs(const std::string& parent) {
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::vector<std::string> parts = absl::StrSplit(name, '_');
    int pid = 0;
    if (parts.size() != 3 || parts[0] != "ddprun" || parts[2].size() != 6 ||
        !absl::SimpleAtoi(parts[1], &pid) || pid <= 0 || pid == ::getpid()) {
      continue;
    }
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code sub;
    std::vector<fs::path> files;
    bool only_error_files = true;
    for (fs::directory_iterator f(it->path(), sub), fend; !sub && f != fend; f.increment(sub)) {
      const std::string file = f->path().filename().string();
      if (!f->is_regular_file(sub) || !absl::StartsWith(file, "attempt_") ||
          !absl::EndsWith(file, "_error.json")) {
        only_error_files = false;
        break;
      }
      files.push_back(f->path());
    }
    if (sub || !only_error_files) continue;
    for (const fs::path& f : files) fs::remove(f, sub);
    ::rmdir(it->path().c_str());
  }
}

int StreamId(int local_rank, StdStream s) { return local_rank * 2 + (s == StdStream::kStderr); }

const char* FileName(StdStream s) { return s == StdStream::kStdout ? "stdout.log" : "stderr.log"; }

}  // namespace

WorkerLogs::WorkerLogs(Options options) : o_(std::move(options)) {}

WorkerLogs::~WorkerLogs() { Finish(); }

absl::Status WorkerLogs::Init() {
  if (o_.log_dir == kNoLogDir) {
    no_files_ = true;  // torchrun's --log-dir /dev/null: nothing is written
    return absl::OkStatus();
  }
  if (!o_.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o_.log_dir, ec);
    if (ec || ::access(o_.log_dir.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot use --log_dir '", o_.log_dir, "': ", ec ? ec.message() : std::strerror(errno),
          "; give a writable directory"));
    }
    dir_ = o_.log_dir;
    return MakeRunDir();
  }
  std::string tmpl;
  bool made = false;
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
    SweepStaleTempDirs(tmp);
    tmpl = TempTemplate(tmp);
  } else {
    tmpl = TempTemplate("/tmp");
    // A directory that will hold only the small error files, removed at
    // exit, goes to tmpfs: on a disk file system every mkdir and rmdir of
    // the per-rank tree (11 for 8 workers) waits on its journal, 0.5 to
    // 40 ms in all on this project's machine (docs/launch.md).
    if (!o_.spec.WritesFiles()) {
      SweepStaleTempDirs(kTmpfsDir);
      std::string shm = TempTemplate(kTmpfsDir);
      if (::mkdtemp(shm.data()) != nullptr) {
        tmpl = std::move(shm);
        made = true;
      }
    }
    if (!made) SweepStaleTempDirs("/tmp");
  }
  if (!made && ::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a log directory from '", tmpl, "': ", std::strerror(errno),
                     "; set TMPDIR to a writable directory or pass --log_dir"));
  }
  dir_ = tmpl;
  temporary_ = true;
  if (!o_.spec.WritesFiles()) return absl::OkStatus();  // the flat layout: no run directory
  DDPRUN_RETURN_IF_ERROR(MakeRunDir());
  std::string line = absl::StrCat("ddprun: worker logs in ", run_dir_, "\n");
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  return absl::OkStatus();
}

absl::Status WorkerLogs::MakeRunDir() {
  // torchrun: tempfile.mkdtemp(prefix=f"{run_id}_", dir=log_dir), 8 characters.
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = o_.job_id + "_";
    for (int i = 0; i < 8; ++i) name.push_back(kChars[rd() % (sizeof(kChars) - 1)]);
    const std::string path = (fs::path(dir_) / name).string();
    if (::mkdir(path.c_str(), 0755) == 0) {
      run_dir_ = path;
      return absl::OkStatus();
    }
    if (errno != EEXIST) break;
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot create a run directory in '", dir_,
                                                 "': ", std::strerror(errno),
                                                 "; give a writable --log_dir"));
}

void WorkerLogs::BeginRound(std::int64_t attempt, const std::set<int>& keep) {
  std::set<int> streams;
  for (int j : keep) {
    streams.insert(StreamId(j, StdStream::kStdout));
    streams.insert(StreamId(j, StdStream::kStderr));
  }
  pump_.CloseAll(kSyncTimeout, streams);
  CloseFilteredFiles();
  attempt_ = attempt;
}

absl::StatusOr<int> WorkerLogs::FilteredFile(StdStream stream) {
  int& fd = stream == StdStream::kStdout ? filtered_fds_[0] : filtered_fds_[1];
  if (fd >= 0) return fd;
  const fs::path dir = fs::path(run_dir_) / absl::StrCat("attempt_", attempt_);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path =
      (dir / (stream == StdStream::kStdout ? "filtered_stdout.log" : "filtered_stderr.log"))
          .string();
  fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno), "; check --log_dir"));
  }
  wrote_logs_ = true;
  return fd;
}

void WorkerLogs::CloseFilteredFiles() {
  for (int& fd : filtered_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

std::string WorkerLogs::WorkerDir(int local_rank) const {
  return (fs::path(run_dir_) / absl::StrCat("attempt_", attempt_) / std::to_string(local_rank))
      .string();
}

absl::Status WorkerLogs::Prepare(int local_rank, int global_rank, SpawnSpec* spec,
                                 std::string* error_file) {
  // The per-rank directory of the tree layout; none in the flat one, which
  // has no log file to put there (holds_only_error_files).
  const bool flat = holds_only_error_files();
  const std::string dir = flat || no_files_ ? std::string() : WorkerDir(local_rank);
  if (no_files_) {
    error_file->clear();
  } else if (flat) {
    // A temporary directory that only ever holds error files, removed at
    // exit, which nobody browses: the files lie flat in it, so a spawn makes
    // no directory and the exit removes one (the <job>/attempt_<round>/<rank>
    // tree was 11 mkdirs and ~90 system calls to remove for 8 workers, a
    // third of a launch's teardown; docs/launch.md, "Sixth pass").
    *error_file =
        (fs::path(dir_) / absl::StrCat("attempt_", attempt_, "_rank_", local_rank, "_error.json"))
            .string();
  } else {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create the worker log directory '",
                                                      dir, "': ", ec.message(),
                                                      "; check --log_dir"));
    }
    // Files of an earlier run with the same id and round would be taken for
    // this one's (torchrun recreates the attempt directory likewise). A
    // fresh temporary directory has none.
    if (!temporary_) {
      for (const char* name : {"error.json", "stdout.log", "stderr.log"})
        fs::remove(fs::path(dir) / name, ec);
    }
    *error_file = (fs::path(dir) / "error.json").string();
  }

  for (StdStream stream : {StdStream::kStdout, StdStream::kStderr}) {
    const StreamPlan plan = PlanStream(o_.spec, local_rank, stream);
    const std::string path = !plan.file  ? ""
                             : no_files_ ? kNoLogDir
                                         : (fs::path(dir) / FileName(stream)).string();
    std::string& spec_path = stream == StdStream::kStdout ? spec->stdout_path : spec->stderr_path;
    int& spec_fd = stream == StdStream::kStdout ? spec->stdout_fd : spec->stderr_fd;
    if (plan.file && !no_files_) wrote_logs_ = true;
    if (!plan.NeedsPipe()) {
      // The child gets the file, /dev/null or the console itself: no copy.
      if (plan.file) {
        spec_path = path;
      } else if (!plan.console) {
        spec_path = "/dev/null";
      }
      continue;
    }
    LogPump::Sink sink;
    if (plan.file) {
      sink.file_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (sink.file_fd < 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            "cannot open worker log '", path, "': ", std::strerror(errno), "; check --log_dir"));
      }
    }
    if (plan.console)
      sink.console_fd = stream == StdStream::kStdout ? o_.console_out : o_.console_err;
    if (plan.prefix) {
      sink.prefix = LinePrefix(o_.spec.prefix_template, o_.host, o_.role, global_rank, local_rank);
    }
    const std::vector<std::string>& filters =
        stream == StdStream::kStdout ? o_.spec.stdout_filters : o_.spec.stderr_filters;
    if (plan.file && plan.console && !filters.empty() && !no_files_) {
      DDPRUN_ASSIGN_OR_RETURN(sink.filtered_fd, FilteredFile(stream));
      sink.filters = filters;
    }
    sink.tail_lines = plan.tail_lines;
    DDPRUN_ASSIGN_OR_RETURN(spec_fd, pump_.Add(StreamId(local_rank, stream), std::move(sink)));
    open_fds_.push_back(spec_fd);
  }
  return absl::OkStatus();
}

void WorkerLogs::AfterSpawn(int /*local_rank*/) {
  // The child has its own copies now; ours would keep the pipes from ever
  // reaching end-of-file.
  for (int fd : open_fds_) ::close(fd);
  open_fds_.clear();
}

void WorkerLogs::Sync() { pump_.Sync(kSyncTimeout); }

std::string WorkerLogs::StderrTail(int local_rank) {
  Sync();
  std::vector<std::string> lines = pump_.Tail(StreamId(local_rank, StdStream::kStderr));
  std::size_t bytes = 0;
  std::size_t first = lines.size();
  while (first > 0 && bytes + lines[first - 1].size() + 1 <= kMaxTailBytes) {
    bytes += lines[--first].size() + 1;
  }
  return absl::StrJoin(lines.begin() + static_cast<std::ptrdiff_t>(first), lines.end(), "\n");
}

std::string WorkerLogs::LogFile(int local_rank) const {
  if (attempt_ < 0 || no_files_) return "";
  for (StdStream s : {StdStream::kStderr, StdStream::kStdout}) {
    if (PlanStream(o_.spec, local_rank, s).file) {
      return (fs::path(WorkerDir(local_rank)) / FileName(s)).string();
    }
  }
  return "";
}

void WorkerLogs::Finish() {
  pump_.CloseAll(kSyncTimeout);
  CloseFilteredFiles();
  if (temporary_ && !wrote_logs_ && !dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);  // gone already on a second call: a no-op
  }
}

}  // namespace ddprun::agent
