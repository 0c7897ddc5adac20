// torchelastic's file timer, served by the agent (torchrun runs it when
// TORCHELASTIC_ENABLE_FILE_TIMER=1). Workers send requests through a FIFO
// (torch.distributed.elastic.timer.FileTimerClient): one JSON line each,
//   {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// where T is epoch seconds (negative: release the timer). When a timer
// expires, the server sends its signal (when > 0) to the pid and forgets
// every timer of that pid, as torch's FileTimerServer does.
//
// Safety: only the agent's current workers are ever signalled; a request
// naming any other pid is dropped (one log line), so that a stray or hostile
// writer cannot kill other processes.
//
// FileTimerBook is the protocol and the bookkeeping, pure and unit-tested
// (no threads, FIFOs or sleeps); FileTimerServer adds the FIFO and a thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent {

inline constexpr const char* kEnvEnableFileTimer = "TORCHELASTIC_ENABLE_FILE_TIMER";
inline constexpr const char* kEnvTimerFile = "TORCHELASTIC_TIMER_FILE";

struct FileTimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // epoch seconds; < 0: release
  int signal = 0;              // <= 0: expire without a signal
};

// One request line (without its '\n'); nullopt for anything else.
std::optional<FileTimerRequest> ParseFileTimerRequest(std::string_view line);

// A pid whose timers expired: the signal to send (0: none) and the scope
// that asked for it (the earliest-expiring timer with a signal, else the
// earliest one).
struct FileTimerExpiry {
  pid_t pid = 0;
  std::string scope_id;
  int signal = 0;
};

class FileTimerBook {
 public:
  // The worker's global rank, or nullopt for a pid that is not one of the
  // agent's current workers. Called from whichever thread feeds the book.
  using WorkerRank = std::function<std::optional<int>(pid_t)>;
  using LogFn = std::function<void(const std::string&)>;

  // Lines longer than this (torch's client refuses them) are dropped.
  static constexpr std::size_t kMaxLine = 4096;  // PIPE_BUF on Linux
  // Timers held at most; further ones are dropped.
  static constexpr std::size_t kMaxTimers = 65536;

  FileTimerBook(WorkerRank worker_rank, LogFn log);

  // Bytes read from the FIFO: each whole line is applied; a partial line
  // waits for the rest.
  void Feed(std::string_view bytes);
  // One parsed request: set or release the (pid, scope_id) timer.
  void Apply(const FileTimerRequest& request);
  // Removes every timer of each pid with a timer expired at `now`, one entry
  // per pid, earliest expiry first.
  std::vector<FileTimerExpiry> TakeExpired(double now);
  // The earliest expiration time held.
  std::optional<double> NextExpiry() const;
  std::size_t size() const { return timers_.size(); }

 private:
  void Line(std::string_view line);
  void Once(int kind, const std::string& msg);

  WorkerRank worker_rank_;
  LogFn log_;
  std::map<std::pair<pid_t, std::string>, FileTimerRequest> timers_;
  std::string partial_;
  bool discarding_ = false;  // inside an over-long line, until its '\n'
  unsigned logged_ = 0;      // bit per kind of dropped request already logged
};

class FileTimerServer {
 public:
  struct Options {
    std::string path;  // the FIFO to create
    FileTimerBook::WorkerRank worker_rank;
    FileTimerBook::LogFn log;
    std::function<double()> now_epoch_s;  // null: the system clock
  };

  // Creates the FIFO (0600; an existing FIFO there is replaced, anything
  // else is refused) and starts the thread that serves it.
  static absl::StatusOr<std::unique_ptr<FileTimerServer>> Start(Options options);
  // Stops the thread and removes the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return options_.path; }

 private:
  class Thread;
  explicit FileTimerServer(Options options);
  Options options_;
  std::unique_ptr<Thread> thread_;
};

// A fresh FIFO path: $TMPDIR (else /tmp)/watchdog_timer_<random>.
std::string FreshTimerFilePath();

}  // namespace ddprun::agent
