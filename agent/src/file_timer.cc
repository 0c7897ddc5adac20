#include "ddprun/agent/file_timer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ddprun/agent/events.h"
#include "nlohmann/json.hpp"

namespace ddprun::agent {
namespace {

// Kinds of dropped input, each logged once per server.
enum DropKind : unsigned { kGarbage = 1, kTooLong = 2, kNotWorker = 4, kFull = 8 };

double SystemEpochS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::optional<FileTimerRequest> ParseFileTimerRequest(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto version = j.find("version");
  auto pid = j.find("pid");
  auto scope = j.find("scope_id");
  auto expiration = j.find("expiration_time");
  auto sig = j.find("signal");
  if (version == j.end() || !version->is_number_integer() || version->get<std::int64_t>() != 1) {
    return std::nullopt;
  }
  if (pid == j.end() || !pid->is_number_integer() || scope == j.end() || !scope->is_string() ||
      expiration == j.end() || !expiration->is_number() || sig == j.end() ||
      !sig->is_number_integer()) {
    return std::nullopt;
  }
  const std::int64_t p = pid->get<std::int64_t>();
  const std::int64_t s = sig->get<std::int64_t>();
  const double t = expiration->get<double>();
  if (p <= 0 || p > std::numeric_limits<pid_t>::max() || !std::isfinite(t) || s >= NSIG ||
      s < std::numeric_limits<int>::min()) {
    return std::nullopt;
  }
  FileTimerRequest r;
  r.pid = static_cast<pid_t>(p);
  r.scope_id = scope->get<std::string>();
  r.expiration_time = t;
  r.signal = static_cast<int>(s);
  return r;
}

FileTimerBook::FileTimerBook(WorkerRank worker_rank, LogFn log)
    : worker_rank_(std::move(worker_rank)), log_(std::move(log)) {}

void FileTimerBook::Once(int kind, const std::string& msg) {
  if ((logged_ & static_cast<unsigned>(kind)) != 0) return;
  logged_ |= static_cast<unsigned>(kind);
  if (log_) log_(absl::StrCat("file timer: ", msg, " (further ones are dropped silently)"));
}

void FileTimerBook::Feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const std::size_t nl = bytes.find('\n');
    const std::string_view chunk = bytes.substr(0, nl);
    if (discarding_) {
      // The rest of an over-long line.
    } else if (partial_.size() + chunk.size() > kMaxLine) {
      Once(kTooLong, absl::StrCat("dropped a request longer than ", kMaxLine, " bytes"));
      partial_.clear();
      discarding_ = true;
    } else if (nl != std::string_view::npos) {
      if (partial_.empty()) {
        Line(chunk);
      } else {
        partial_.append(chunk);
        Line(partial_);
        partial_.clear();
      }
    } else {
      partial_.append(chunk);
    }
    if (nl == std::string_view::npos) return;
    discarding_ = false;
    bytes.remove_prefix(nl + 1);
  }
}

void FileTimerBook::Line(std::string_view line) {
  if (line.empty()) return;
  std::optional<FileTimerRequest> r = ParseFileTimerRequest(line);
  if (!r) {
    Once(kGarbage, absl::StrCat("dropped a request that is not a timer request: ",
                                std::string(line.substr(0, 80))));
    return;
  }
  Apply(*r);
}

void FileTimerBook::Apply(const FileTimerRequest& request) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.expiration_time < 0) {
    timers_.erase(key);
    return;
  }
  if (!worker_rank_ || !worker_rank_(request.pid)) {
    Once(kNotWorker, absl::StrCat("ignored a request for pid ", request.pid,
                                  ", which is not one of this node's workers"));
    return;
  }
  if (timers_.size() >= kMaxTimers && timers_.find(key) == timers_.end()) {
    Once(kFull, absl::StrCat("dropped a request: ", kMaxTimers, " timers are already set"));
    return;
  }
  timers_[std::move(key)] = request;
}

std::vector<FileTimerExpiry> FileTimerBook::TakeExpired(double now) {
  // Per pid: its earliest expired timer, and its earliest one with a signal.
  std::map<pid_t, std::pair<const FileTimerRequest*, const FileTimerRequest*>> by_pid;
  for (const auto& [key, t] : timers_) {
    if (t.expiration_time > now) continue;
    auto& [first, with_signal] = by_pid[key.first];
    if (first == nullptr || t.expiration_time < first->expiration_time) first = &t;
    if (t.signal > 0 &&
        (with_signal == nullptr || t.expiration_time < with_signal->expiration_time)) {
      with_signal = &t;
    }
  }
  std::vector<std::pair<double, FileTimerExpiry>> out;
  for (const auto& [pid, pair] : by_pid) {
    const FileTimerRequest& chosen = pair.second != nullptr ? *pair.second : *pair.first;
    out.push_back({pair.first->expiration_time,
                   FileTimerExpiry{pid, chosen.scope_id, std::max(chosen.signal, 0)}});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = by_pid.count(it->first.first) != 0 ? timers_.erase(it) : std::next(it);
  }
  std::vector<FileTimerExpiry> result;
  result.reserve(out.size());
  for (auto& [when, e] : out) result.push_back(std::move(e));
  return result;
}

std::optional<double> FileTimerBook::NextExpiry() const {
  std::optional<double> next;
  for (const auto& [key, t] : timers_) {
    if (!next || t.expiration_time < *next) next = t.expiration_time;
  }
  return next;
}

// ------------------------------------------------------------------ server

class FileTimerServer::Thread {
 public:
  Thread(const Options& o, int read_fd, int write_fd, int wake_r, int wake_w)
      : options_(o),
        read_fd_(read_fd),
        dummy_write_fd_(write_fd),
        wake_r_(wake_r),
        wake_w_(wake_w),
        book_(o.worker_rank, o.log),
        thread_([this] { Loop(); }) {}

  ~Thread() {
    const char b = 0;
    (void)!::write(wake_w_, &b, 1);
    thread_.join();
    ::close(read_fd_);
    ::close(dummy_write_fd_);
    ::close(wake_r_);
    ::close(wake_w_);
  }

 private:
  double Now() const { return options_.now_epoch_s ? options_.now_epoch_s() : SystemEpochS(); }

  void Loop() {
    constexpr double kInterval = 0.1;
    char buf[8192];
    while (true) {
      double wait = kInterval;
      if (auto next = book_.NextExpiry()) wait = std::clamp(*next - Now(), 0.0, kInterval);
      pollfd fds[2] = {{read_fd_, POLLIN, 0}, {wake_r_, POLLIN, 0}};
      const int n = ::poll(fds, 2, static_cast<int>(std::ceil(wait * 1000)));
      if (n < 0 && errno != EINTR) return;
      if (n > 0 && fds[1].revents != 0) return;
      if (n > 0 && (fds[0].revents & POLLIN) != 0) {
        while (true) {
          const ssize_t got = ::read(read_fd_, buf, sizeof buf);
          if (got <= 0) break;
          book_.Feed(std::string_view(buf, static_cast<std::size_t>(got)));
        }
      }
      for (const FileTimerExpiry& e : book_.TakeExpired(Now())) Expire(e);
    }
  }

  void Expire(const FileTimerExpiry& e) {
    std::optional<int> rank = options_.worker_rank ? options_.worker_rank(e.pid) : std::nullopt;
    if (!rank) return;  // exited (and forgotten) since it set the timer
    const std::string who =
        absl::StrCat("scope ", e.scope_id, " of worker rank ", *rank, " (pid ", e.pid, ") expired");
    if (e.signal <= 0) {
      if (options_.log) options_.log(absl::StrCat("file timer: ", who, "; no signal to send"));
      return;
    }
    if (::kill(e.pid, e.signal) != 0) {
      if (options_.log) {
        options_.log(absl::StrCat("file timer: ", who, "; could not send ", SignalName(e.signal),
                                  ": ", std::strerror(errno)));
      }
      return;
    }
    if (options_.log)
      options_.log(absl::StrCat("file timer: ", who, "; sent ", SignalName(e.signal)));
  }

  const Options& options_;
  const int read_fd_;
  const int dummy_write_fd_;  // so that the FIFO never reads EOF
  const int wake_r_;
  const int wake_w_;
  FileTimerBook book_;
  std::thread thread_;
};

FileTimerServer::FileTimerServer(Options options) : options_(std::move(options)) {}

FileTimerServer::~FileTimerServer() {
  thread_.reset();
  ::unlink(options_.path.c_str());
}

absl::StatusOr<std::unique_ptr<FileTimerServer>> FileTimerServer::Start(Options options) {
  const std::string& path = options.path;
  auto fail = [&path](const char* what) {
    return absl::FailedPreconditionError(
        absl::StrCat("file timer: cannot ", what, " ", path, ": ", std::strerror(errno)));
  };
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("file timer: ", kEnvTimerFile, "=", path,
                                                        " exists and is not a FIFO; remove it or "
                                                        "choose another path"));
    }
    if (::unlink(path.c_str()) != 0) return fail("replace the FIFO");
  }
  if (::mkfifo(path.c_str(), 0600) != 0) return fail("create the FIFO");
  const int rd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (rd < 0) {
    auto s = fail("open the FIFO");
    ::unlink(path.c_str());
    return s;
  }
  const int wr = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  int wake[2] = {-1, -1};
  if (wr < 0 || ::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    auto s = fail("open the FIFO");
    ::close(rd);
    if (wr >= 0) ::close(wr);
    ::unlink(path.c_str());
    return s;
  }
  std::unique_ptr<FileTimerServer> server(new FileTimerServer(std::move(options)));
  server->thread_ = std::make_unique<Thread>(server->options_, rd, wr, wake[0], wake[1]);
  return server;
}

std::string FreshTimerFilePath() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<std::uint64_t>(::getpid()));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(gen()));
  return absl::StrCat(dir, "/watchdog_timer_", hex);
}

}  // namespace ddprun::agent
