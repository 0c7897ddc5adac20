// The agent's side of worker output, one round at a time: the log directory
// (torchrun's layout, one attempt directory per restart count), the error
// file of each worker, where each of its streams goes (see log_spec.h), the
// pipes and the pump, and the details the failure report needs.
//
//   <log_dir>/<run_id>_<suffix>/attempt_<restart count>/<local_rank>/
//       {stdout.log,stderr.log,error.json}
//
// As torchrun 2.x: <suffix> is 8 random characters chosen when the agent
// starts (nodes sharing a file system and a --log_dir never mix), and a
// round that re-forms without a failure (a node joined or left) reuses its
// attempt directory, whose old files are removed first.
//
// --log_dir /dev/null (torchrun's os.devnull): no directory and no files; a
// stream redirected to a file goes to /dev/null, workers get an empty
// TORCHELASTIC_ERROR_FILE.
//
// Without --log_dir, a fresh mkdtemp directory holds the error files, and
// the logs when -r/-t ask for files; it is removed at exit when it holds no
// log file (the error messages are in the report). It is $TMPDIR/ddprun_XXXXXX;
// without TMPDIR, /dev/shm/ddprun_XXXXXX when it will hold only error files
// (tmpfs: no journal wait per mkdir/rmdir), else /tmp/ddprun_XXXXXX.
//
// Only the agent's main thread calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ddprun/agent/log_pump.h"
#include "ddprun/agent/log_spec.h"
#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/types.h"

namespace ddprun::agent {

class WorkerLogs {
 public:
  struct Options {
    LogSpec spec;
    std::string log_dir;  // --log_dir; empty: a temporary directory
    std::string job_id;
    std::string role;
    std::string host;     // in console prefixes
    int console_out = 1;  // ddprun's stdout / stderr (tests pass others)
    int console_err = 2;
  };
  explicit WorkerLogs(Options options);
  ~WorkerLogs();  // Finish()

  // Creates the log directory (or the temporary one). A one-line error when
  // it cannot.
  absl::Status Init();
  const std::string& log_dir() const { return dir_; }
  bool is_temporary() const { return temporary_; }
  // A temporary directory that holds only the error files, flat: removed at
  // exit, and by the launcher's guard if the agent is killed.
  bool holds_only_error_files() const { return temporary_ && !o_.spec.WritesFiles(); }

  // Starts the round whose TORCHELASTIC_RESTART_COUNT is `attempt`; the
  // previous round's streams are drained and closed, but those of the local
  // ranks in `keep` (an in-place restart's survivors, which keep writing to
  // them; their files stay in the attempt they started in).
  void BeginRound(std::int64_t attempt, const std::set<int>& keep = {});
  // <log_dir>/<run_id>_<suffix> of the tree layout; "" for the flat one.
  const std::string& run_dir() const { return run_dir_; }
  // Prepares one worker of the round: its directory (stale files removed),
  // its error file path, and its stdout/stderr in `spec` (a path, or a pipe
  // to the pump). Call AfterSpawn(local_rank) once Spawn returned.
  absl::Status Prepare(int local_rank, int global_rank, SpawnSpec* spec, std::string* error_file);
  void AfterSpawn(int local_rank);

  // Everything the workers wrote so far has reached the console and files.
  void Sync();
  // The last lines of the worker's stderr ("" without a tail), after Sync().
  std::string StderrTail(int local_rank);
  // The worker's log file for the report: stderr.log, else stdout.log, else "".
  std::string LogFile(int local_rank) const;
  // At exit: drains and closes every stream, then removes a temporary
  // directory that holds no logs. Idempotent.
  void Finish();

 private:
  std::string WorkerDir(int local_rank) const;
  absl::Status MakeRunDir();
  // The attempt's filtered_stdout.log / filtered_stderr.log, opened on first use.
  absl::StatusOr<int> FilteredFile(StdStream stream);
  void CloseFilteredFiles();

  Options o_;
  std::string dir_;
  std::string run_dir_;
  int filtered_fds_[2] = {-1, -1};  // stdout, stderr of the current attempt
  bool temporary_ = false;
  bool no_files_ = false;  // --log_dir /dev/null
  bool wrote_logs_ = false;
  std::int64_t attempt_ = -1;
  LogPump pump_;
  std::vector<int> open_fds_;  // write ends handed to the child being spawned
};

}  // namespace ddprun::agent
