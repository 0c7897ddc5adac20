#include "ddprun/agent/log_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ddprun::agent {
namespace {

// A prefixed partial line longer than this is written out as a line.
constexpr std::size_t kMaxPendingLine = 64 * 1024;
// Bytes read from one stream per poll round (fairness between workers).
constexpr std::size_t kReadBudget = 256 * 1024;
// Bytes read from one stream by a Sync/CloseAll: more than a pipe holds.
constexpr std::size_t kSyncBudget = 4 * 1024 * 1024;

}  // namespace

struct LogPump::Stream {
  int id = 0;
  int fd = -1;  // read end, non-blocking; -1 once closed
  Sink sink;
  std::string pending;    // prefixed console: the partial line
  bool after_cr = false;  // prefixed console: the last line ended with '\r'
};

LogPump::LogPump() = default;

LogPump::~LogPump() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) {
    Wake();
    thread_.join();
  }
  for (auto& s : pending_) Finish(*s);  // only when the thread never ran
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

absl::StatusOr<int> LogPump::Add(int id, Sink sink) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    const int e = errno;
    if (sink.file_fd >= 0) ::close(sink.file_fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot create a pipe for worker output: ", std::strerror(e)));
  }
  ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
  auto s = std::make_unique<Stream>();
  s->id = id;
  s->fd = p[0];
  s->sink = std::move(sink);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wake_fd_ < 0) {
      wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (wake_fd_ < 0) {
        const int e = errno;
        ::close(p[0]);
        ::close(p[1]);
        if (s->sink.file_fd >= 0) ::close(s->sink.file_fd);
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot create the log pump's eventfd: ", std::strerror(e)));
      }
    }
    tails_[id] = TailState{};
    pending_.push_back(std::move(s));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  Wake();
  return p[1];
}

void LogPump::Wake() {
  if (wake_fd_ < 0) return;
  const std::uint64_t one = 1;
  ssize_t r;
  do {
    r = ::write(wake_fd_, &one, sizeof(one));
  } while (r < 0 && errno == EINTR);
}

bool LogPump::Sync(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!thread_.joinable()) return true;
  const std::uint64_t req = ++sync_requested_;
  lock.unlock();
  Wake();
  lock.lock();
  return cv_.wait_for(lock, timeout, [&] { return sync_done_ >= req; });
}

void LogPump::CloseAll(std::chrono::milliseconds timeout, const std::set<int>& keep) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!thread_.joinable()) return;
  close_keep_ = keep;
  const std::uint64_t req = ++close_requested_;
  lock.unlock();
  Wake();
  lock.lock();
  cv_.wait_for(lock, timeout, [&] { return close_done_ >= req; });
}

std::vector<std::string> LogPump::Tail(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tails_.find(id);
  if (it == tails_.end()) return {};
  std::vector<std::string> out(it->second.lines.begin(), it->second.lines.end());
  if (!it->second.partial.empty()) out.push_back(it->second.partial);
  return out;
}

void LogPump::Loop() {
  // A console that went away must not kill ddprun: write() then fails with
  // EPIPE in this thread instead.
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);

  std::vector<pollfd> pfds;
  std::vector<Stream*> polled;
  while (true) {
    std::uint64_t sync_req = 0, close_req = 0;
    bool stop = false;
    std::set<int> keep;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& s : pending_) streams_.push_back(std::move(s));
      pending_.clear();
      sync_req = sync_requested_;
      close_req = close_requested_;
      if (close_req > close_done_) keep = close_keep_;
      stop = stop_;
    }
    if (sync_req > sync_done_ || close_req > close_done_ || stop) {
      for (auto& s : streams_) Drain(*s, kSyncBudget);
      if (close_req > close_done_ || stop) {
        for (auto& s : streams_) {
          if (stop || keep.count(s->id) == 0) Finish(*s);
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        sync_done_ = sync_req;
        close_done_ = close_req;
      }
      cv_.notify_all();
      if (stop) return;
    }
    streams_.erase(std::remove_if(streams_.begin(), streams_.end(),
                                  [](const std::unique_ptr<Stream>& s) { return s->fd < 0; }),
                   streams_.end());

    pfds.clear();
    polled.clear();
    pfds.push_back(pollfd{wake_fd_, POLLIN, 0});
    for (auto& s : streams_) {
      pfds.push_back(pollfd{s->fd, POLLIN, 0});
      polled.push_back(s.get());
    }
    int n = ::poll(pfds.data(), pfds.size(), -1);
    if (n < 0) continue;  // EINTR
    if (pfds[0].revents != 0) {
      std::uint64_t v;
      while (::read(wake_fd_, &v, sizeof(v)) > 0) {
      }
    }
    for (std::size_t i = 0; i < polled.size(); ++i) {
      if (pfds[i + 1].revents != 0) Drain(*polled[i], kReadBudget);
    }
  }
}

void LogPump::Drain(Stream& s, std::size_t budget) {
  char buf[64 * 1024];
  while (s.fd >= 0 && budget > 0) {
    ssize_t r = ::read(s.fd, buf, std::min(sizeof(buf), budget));
    if (r > 0) {
      Process(s, buf, static_cast<std::size_t>(r));
      budget -= static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Finish(s);  // EOF (every writer closed it) or an error
    return;
  }
}

void LogPump::Process(Stream& s, const char* data, std::size_t n) {
  Sink& k = s.sink;
  if (k.file_fd >= 0 && !WriteAll(k.file_fd, data, n)) {
    ::close(k.file_fd);  // disk full or similar: keep the console copy going
    k.file_fd = -1;
  }
  if (k.console_fd >= 0) {
    bool ok = true;
    if (k.prefix.empty()) {
      ok = WriteAll(k.console_fd, data, n);
    } else {
      // Whole lines only, each with the prefix; '\r' ends a line too, so a
      // progress bar keeps redrawing in place ("\r\n" is one ending).
      std::string out, filtered;
      std::size_t start = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const char c = data[i];
        if (c != '\n' && c != '\r') continue;
        if (c == '\n' && s.after_cr && i == start && s.pending.empty()) {
          out += '\n';
        } else {
          const std::size_t line_at = out.size();
          out += k.prefix;
          out += s.pending;
          out.append(data + start, i - start);
          out += c;
          s.pending.clear();
          if (k.filtered_fd >= 0) {
            const absl::string_view line = absl::string_view(out).substr(line_at);
            const absl::string_view text = line.substr(k.prefix.size());
            for (const std::string& f : k.filters) {
              if (absl::StrContains(text, f)) {
                filtered.append(line.data(), line.size());
                break;
              }
            }
          }
        }
        s.after_cr = c == '\r';
        start = i + 1;
      }
      if (start < n) {
        s.pending.append(data + start, n - start);
        s.after_cr = false;
      }
      if (s.pending.size() >= kMaxPendingLine) {
        absl::StrAppend(&out, k.prefix, s.pending, "\n");
        s.pending.clear();
      }
      if (!out.empty()) ok = WriteAll(k.console_fd, out.data(), out.size());
      if (!filtered.empty() && !WriteAll(k.filtered_fd, filtered.data(), filtered.size())) {
        k.filtered_fd = -1;
      }
    }
    if (!ok) k.console_fd = -1;  // the console is gone: stop copying to it
  }
  if (k.tail_lines > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tails_.find(s.id);
    if (it != tails_.end()) AddTail(it->second, s, data, n);
  }
}

void LogPump::AddTail(TailState& t, const Stream& s, const char* data, std::size_t n) {
  const std::size_t max_lines = static_cast<std::size_t>(s.sink.tail_lines);
  auto push = [&] {
    t.lines.push_back(std::move(t.partial));
    t.partial.clear();
    while (t.lines.size() > max_lines) t.lines.pop_front();
  };
  for (std::size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (t.cr) {
      t.cr = false;
      if (c == '\n') {
        push();
        continue;
      }
      t.partial.clear();  // a bare '\r' redraws the line: keep the last version
    }
    if (c == '\n') {
      push();
    } else if (c == '\r') {
      t.cr = true;
    } else if (t.partial.size() < s.sink.max_line) {
      t.partial += c;
    }
  }
}

void LogPump::Finish(Stream& s) {
  if (s.fd < 0) return;
  if (!s.pending.empty() && s.sink.console_fd >= 0) {
    std::string out = absl::StrCat(s.sink.prefix, s.pending, "\n");
    WriteAll(s.sink.console_fd, out.data(), out.size());
  }
  s.pending.clear();
  ::close(s.fd);
  s.fd = -1;
  if (s.sink.file_fd >= 0) ::close(s.sink.file_fd);
  s.sink.file_fd = -1;
}

bool LogPump::WriteAll(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A non-blocking console (someone set O_NONBLOCK on a shared tty):
      // wait for room, bounded, rather than spin or drop.
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace ddprun::agent
