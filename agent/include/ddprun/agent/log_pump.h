// The agent's log pump: one thread that reads every piped worker stream with
// poll() and writes each to its sinks: a log file (raw bytes as they come),
// the console (raw, or line-buffered with a per-worker prefix, one write()
// per batch of whole lines so lines of different workers never mix), and an
// in-memory tail of the last lines (for the failure report).
//
// The thread starts with the first stream, so a job whose workers all
// inherit the console costs nothing. SIGPIPE is blocked in it: a console
// that went away (ddprun ... | head) only stops the console copy.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace ddprun::agent {

class LogPump {
 public:
  struct Sink {
    int file_fd = -1;            // owned by the pump once added; -1: no file
    int console_fd = -1;         // not owned (ddprun's 1 or 2); -1: not shown
    std::string prefix;          // console lines start with it; empty: raw passthrough
    int tail_lines = 0;          // lines kept in memory
    std::size_t max_line = 512;  // a tail line is cut to this many bytes
    // torchrun's --duplicate-std{out,err}-filters: each prefixed console line
    // that contains one of these is also written to filtered_fd (not owned;
    // the attempt's filtered_{stdout,stderr}.log, shared by its workers).
    std::vector<std::string> filters;
    int filtered_fd = -1;
  };

  LogPump();
  ~LogPump();  // closes every stream (after a last drain)
  LogPump(const LogPump&) = delete;
  LogPump& operator=(const LogPump&) = delete;

  // A new stream; returns the write end of its pipe (close-on-exec), for the
  // child's stdout or stderr. The caller closes it once the child has it.
  // `id` names the stream in Tail(); ids are reused after CloseAll().
  absl::StatusOr<int> Add(int id, Sink sink);

  // Returns once everything that could be read from the pipes when it was
  // called has been written to the sinks (or after `timeout`: false).
  bool Sync(std::chrono::milliseconds timeout);

  // The last lines of stream `id` (a partial last line included), oldest first.
  std::vector<std::string> Tail(int id) const;

  // Drains every stream, then closes them all (partial lines are flushed);
  // data written after that is lost (EPIPE for the writer).
  // Streams whose id is in `keep` stay open (the processes of an in-place
  // restart's survivors go on writing to them).
  void CloseAll(std::chrono::milliseconds timeout, const std::set<int>& keep = {});

 private:
  struct Stream;
  void Loop();
  void Wake();
  void Drain(Stream& s, std::size_t budget);
  void Process(Stream& s, const char* data, std::size_t n);
  void Finish(Stream& s);
  struct TailState {
    std::deque<std::string> lines;
    std::string partial;
    bool cr = false;  // the last byte was '\r'
  };
  static void AddTail(TailState& t, const Stream& s, const char* data, std::size_t n);
  static bool WriteAll(int fd, const char* data, std::size_t n);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  int wake_fd_ = -1;
  bool stop_ = false;
  std::uint64_t sync_requested_ = 0, sync_done_ = 0;
  std::uint64_t close_requested_ = 0, close_done_ = 0;
  std::set<int> close_keep_;                      // the ids the newest CloseAll keeps open
  std::vector<std::unique_ptr<Stream>> pending_;  // added, not yet seen by the thread
  std::vector<std::unique_ptr<Stream>> streams_;  // owned by the thread
  std::map<int, TailState> tails_;                // under mu_
};

}  // namespace ddprun::agent
