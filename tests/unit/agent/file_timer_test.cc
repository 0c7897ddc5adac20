// torchelastic's file timer: the request parser and the bookkeeping
// (FileTimerBook), without threads, FIFOs or sleeps; and one real FIFO.
#include "ddprun/agent/file_timer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ddprun::agent {
namespace {

std::string Request(int pid, const std::string& scope, double t, int sig) {
  return "{\"version\": 1, \"pid\": " + std::to_string(pid) + ", \"scope_id\": \"" + scope +
         "\", \"expiration_time\": " + std::to_string(t) + ", \"signal\": " + std::to_string(sig) +
         "}\n";
}

struct Book {
  std::vector<std::string> logs;
  std::vector<pid_t> workers = {100, 101};
  FileTimerBook book{[this](pid_t p) -> std::optional<int> {
                       for (std::size_t i = 0; i < workers.size(); ++i) {
                         if (workers[i] == p) return static_cast<int>(i);
                       }
                       return std::nullopt;
                     },
                     [this](const std::string& m) { logs.push_back(m); }};
};

TEST_CASE("file timer: a good request parses as torch's client writes it", "[unit]") {
  auto r = ParseFileTimerRequest(
      R"({"version": 1, "pid": 42, "scope_id": "train.py#12", "expiration_time": 1700000000.5, "signal": 9})");
  REQUIRE(r);
  CHECK(r->pid == 42);
  CHECK(r->scope_id == "train.py#12");
  CHECK(r->expiration_time == 1700000000.5);
  CHECK(r->signal == 9);
  auto release = ParseFileTimerRequest(
      R"({"version":1,"pid":42,"scope_id":"s","expiration_time":-1,"signal":0})");
  REQUIRE(release);
  CHECK(release->expiration_time < 0);
}

TEST_CASE("file timer: garbage does not parse", "[unit]") {
  for (const char* line :
       {"not json", "", "[]", "{}", "{\"version\": 1}",
        R"({"version":2,"pid":1,"scope_id":"s","expiration_time":1,"signal":9})",
        R"({"version":1,"pid":-3,"scope_id":"s","expiration_time":1,"signal":9})",
        R"({"version":1,"pid":"1","scope_id":"s","expiration_time":1,"signal":9})",
        R"({"version":1,"pid":1,"scope_id":7,"expiration_time":1,"signal":9})",
        R"({"version":1,"pid":1,"scope_id":"s","expiration_time":1,"signal":999})",
        R"({"version":1,"pid":1,"scope_id":"s","expiration_time":1})"}) {
    CAPTURE(line);
    CHECK_FALSE(ParseFileTimerRequest(line));
  }
}

TEST_CASE("file timer: a timer expires, kills once and is forgotten", "[unit]") {
  Book b;
  b.book.Feed(Request(100, "a", 10.0, SIGKILL));
  CHECK(b.book.size() == 1);
  CHECK(b.book.NextExpiry() == 10.0);
  CHECK(b.book.TakeExpired(9.9).empty());
  auto e = b.book.TakeExpired(10.0);
  REQUIRE(e.size() == 1);
  CHECK(e[0].pid == 100);
  CHECK(e[0].scope_id == "a");
  CHECK(e[0].signal == SIGKILL);
  CHECK(b.book.size() == 0);
  CHECK(b.book.TakeExpired(20.0).empty());
  CHECK(b.logs.empty());
}

TEST_CASE("file timer: a release removes the timer", "[unit]") {
  Book b;
  b.book.Feed(Request(100, "a", 10.0, SIGKILL) + Request(100, "b", 12.0, SIGKILL));
  b.book.Feed(Request(100, "a", -1, 0));
  CHECK(b.book.size() == 1);
  CHECK(b.book.NextExpiry() == 12.0);
  CHECK(b.book.TakeExpired(11.0).empty());
}

TEST_CASE("file timer: lines split across reads are joined", "[unit]") {
  Book b;
  const std::string line = Request(101, "x", 5.0, SIGTERM);
  b.book.Feed(line.substr(0, 7));
  CHECK(b.book.size() == 0);
  b.book.Feed(line.substr(7));
  CHECK(b.book.size() == 1);
}

TEST_CASE("file timer: garbage and over-long lines are dropped, logged once per kind", "[unit]") {
  Book b;
  b.book.Feed("not json\n{\"also\": \"garbage\"}\n");
  b.book.Feed(std::string(FileTimerBook::kMaxLine + 10, 'x'));
  b.book.Feed("still the long line\n");
  b.book.Feed(std::string(3 * FileTimerBook::kMaxLine, 'y') + "\n");
  b.book.Feed(Request(100, "ok", 1.0, SIGKILL));
  CHECK(b.book.size() == 1);
  REQUIRE(b.logs.size() == 2);
  CHECK(b.logs[0].find("not a timer request") != std::string::npos);
  CHECK(b.logs[1].find("longer than") != std::string::npos);
}

TEST_CASE("file timer: a pid that is not a worker is ignored", "[unit]") {
  Book b;
  b.book.Feed(Request(1, "init", 1.0, SIGKILL) + Request(555, "x", 1.0, SIGKILL));
  CHECK(b.book.size() == 0);
  REQUIRE(b.logs.size() == 1);
  CHECK(b.logs[0].find("pid 1,") != std::string::npos);
}

TEST_CASE("file timer: expiries come earliest first, one per pid", "[unit]") {
  Book b;
  b.book.Feed(Request(101, "late", 3.0, SIGKILL) + Request(100, "a", 5.0, SIGKILL) +
              Request(101, "early", 2.0, SIGTERM) + Request(100, "b", 1.0, SIGKILL) +
              Request(100, "future", 50.0, SIGKILL));
  auto e = b.book.TakeExpired(10.0);
  REQUIRE(e.size() == 2);
  CHECK(e[0].pid == 100);
  CHECK(e[0].scope_id == "b");
  CHECK(e[1].pid == 101);
  CHECK(e[1].scope_id == "early");
  CHECK(e[1].signal == SIGTERM);
  CHECK(b.book.size() == 0);  // every timer of a reaped pid, as torch's server
}

TEST_CASE("file timer: signal 0 expires without a kill", "[unit]") {
  Book b;
  b.book.Feed(Request(100, "quiet", 1.0, 0));
  auto e = b.book.TakeExpired(2.0);
  REQUIRE(e.size() == 1);
  CHECK(e[0].signal == 0);
  CHECK(b.book.size() == 0);
  // The earliest timer with a signal wins over an earlier one without.
  b.book.Feed(Request(100, "quiet", 1.0, 0) + Request(100, "loud", 1.5, SIGKILL));
  e = b.book.TakeExpired(2.0);
  REQUIRE(e.size() == 1);
  CHECK(e[0].scope_id == "loud");
  CHECK(e[0].signal == SIGKILL);
}

TEST_CASE("file timer server: refuses a path that is not a FIFO", "[unit]") {
  char dir[] = "/tmp/ddprun_timer_test_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/file";
  std::ofstream(path) << "x";
  FileTimerServer::Options o;
  o.path = path;
  auto s = FileTimerServer::Start(std::move(o));
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.status().message()).find("not a FIFO") != std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST_CASE("file timer server: kills a worker whose timer expired, through the FIFO", "[unit]") {
  char dir[] = "/tmp/ddprun_timer_test_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/timer";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  std::vector<std::string> logs;
  std::mutex mu;
  FileTimerServer::Options o;
  o.path = path;
  o.worker_rank = [child](pid_t p) -> std::optional<int> {
    return p == child ? std::optional<int>(3) : std::nullopt;
  };
  o.log = [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    logs.push_back(m);
  };
  auto s = FileTimerServer::Start(std::move(o));
  REQUIRE(s.ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
  REQUIRE(fd >= 0);
  const std::string req = "garbage\n" + Request(child, "step", now + 0.2, SIGKILL);
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  ::close(fd);  // the server holds its own write end: no EOF
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  s->reset();
  CHECK(::access(path.c_str(), F_OK) != 0);  // removed at stop
  ::rmdir(dir);
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(logs.size() == 2);
  CHECK(logs[1] == "file timer: scope step of worker rank 3 (pid " + std::to_string(child) +
                       ") expired; sent SIGKILL");
}

}  // namespace
}  // namespace ddprun::agent
