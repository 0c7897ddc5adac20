// Worker output: the -r/-t spec and its per-stream plan, line prefixes, the
// error-file reader, the log pump (prefixing, files, tails, '\r', a console
// that went away) and WorkerLogs' directory layout.
#include "ddprun/agent/log_pump.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "ddprun/agent/log_spec.h"
#include "ddprun/agent/worker_logs.h"

namespace ddprun::agent {
namespace {

using Catch::Matchers::Contains;
using std::chrono::milliseconds;
namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A pipe standing in for ddprun's console.
struct Console {
  int rd = -1, wr = -1;
  Console() {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    rd = p[0];
    wr = p[1];
    ::fcntl(rd, F_SETFL, O_NONBLOCK);
  }
  ~Console() {
    if (rd >= 0) ::close(rd);
    if (wr >= 0) ::close(wr);
  }
  std::string Read() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(rd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }
};

void Write(int fd, const std::string& s) {
  REQUIRE(::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/ddprun_logtest_XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST_CASE("redirect spec: one value or a per-local-rank map", "[unit]") {
  for (int v = 0; v <= 3; ++v) {
    auto s = ParseStdStreams(std::to_string(v));
    REQUIRE(s.ok());
    CHECK(s->all == v);
    CHECK(s->ForLocalRank(7) == v);
  }
  auto m = ParseStdStreams("0:1,1:2, 3:3");
  REQUIRE(m.ok());
  CHECK(m->ForLocalRank(0) == 1);
  CHECK(m->ForLocalRank(1) == 2);
  CHECK(m->ForLocalRank(2) == 0);  // unlisted
  CHECK(m->ForLocalRank(3) == 3);
  CHECK(m->Any());
  CHECK_FALSE(ParseStdStreams("0:0")->Any());
  CHECK_FALSE(ParseStdStreams("0")->Any());
  for (const char* bad : {"4", "-1", "x", "", "0:4", "a:1", "0:", "1:2,x"}) {
    CAPTURE(bad);
    auto b = ParseStdStreams(bad);
    REQUIRE_FALSE(b.ok());
    CHECK_THAT(std::string(b.status().message()), Contains("must be 0 (none), 1 (stdout)"));
  }
}

TEST_CASE("stream plan: torchrun's -r/-t/filter, the tail and --prefix_output", "[unit]") {
  LogSpec spec;
  // Default: stdout inherits the console (no pipe); stderr goes through the
  // pump only for its tail, unprefixed.
  StreamPlan out = PlanStream(spec, 0, StdStream::kStdout);
  CHECK((!out.file && out.console && !out.prefix && out.tail_lines == 0 && !out.NeedsPipe()));
  StreamPlan err = PlanStream(spec, 0, StdStream::kStderr);
  CHECK((!err.file && err.console && !err.prefix && err.tail_lines == 20 && err.NeedsPipe()));

  spec.stderr_tail_lines = 0;  // zero overhead: both streams inherit
  CHECK_FALSE(PlanStream(spec, 0, StdStream::kStderr).NeedsPipe());

  // -r 1: stdout to its file only; the child writes the file itself.
  spec.redirects = *ParseStdStreams("1");
  out = PlanStream(spec, 0, StdStream::kStdout);
  CHECK((out.file && !out.console && !out.NeedsPipe()));
  CHECK(PlanStream(spec, 0, StdStream::kStderr).console);

  // -t 3: both to files and to the console, prefixed.
  spec.redirects = {};
  spec.tee = *ParseStdStreams("3");
  for (StdStream s : {StdStream::kStdout, StdStream::kStderr}) {
    StreamPlan p = PlanStream(spec, 2, s);
    CHECK((p.file && p.console && p.prefix && p.NeedsPipe()));
  }

  // Per rank: -r 0:3 -t 1:2.
  spec.redirects = *ParseStdStreams("0:3");
  spec.tee = *ParseStdStreams("1:2");
  CHECK_FALSE(PlanStream(spec, 0, StdStream::kStdout).console);
  CHECK(PlanStream(spec, 0, StdStream::kStdout).file);
  CHECK_FALSE(PlanStream(spec, 1, StdStream::kStdout).file);
  CHECK_FALSE(PlanStream(spec, 1, StdStream::kStdout).prefix);
  CHECK(PlanStream(spec, 1, StdStream::kStderr).prefix);

  // --local_ranks_filter: console only; files are unaffected.
  spec.redirects = {};
  spec.tee = *ParseStdStreams("3");
  spec.local_ranks_filter = {1};
  CHECK(PlanStream(spec, 1, StdStream::kStdout).console);
  out = PlanStream(spec, 0, StdStream::kStdout);
  CHECK((out.file && !out.console));
  spec.tee = {};
  out = PlanStream(spec, 0, StdStream::kStdout);
  CHECK((!out.file && !out.console && !out.NeedsPipe()));  // the child gets /dev/null

  // --prefix_output prefixes what stays on the console.
  spec = LogSpec{};
  spec.prefix_output = true;
  out = PlanStream(spec, 0, StdStream::kStdout);
  CHECK((out.console && out.prefix && out.NeedsPipe()));
}

// As torch 2.11's torchrun printed them on a GPU machine (docs/gpu.md):
// "[default0]:", "[rank0]:" with --role rank, and its template's macros.
TEST_CASE("line prefix: torchrun's default and template macros", "[unit]") {
  CHECK(LinePrefix("", "node1", "default", 5, 1) == "[default1]:");
  CHECK(LinePrefix("", "node1", "rank", 5, 0) == "[rank0]:");
  CHECK(LinePrefix("[${role_name}${local_rank}]:", "node1", "trainer", 5, 1) == "[trainer1]:");
  CHECK(LinePrefix("${host}/${rank}> ", "n", "r", 12, 0) == "n/12> ");
  CHECK(LinePrefix("[${hostname}:${rank}:${local_rank}]:", "node1", "d", 5, 1) == "[node1:5:1]:");
  // Unbraced, as string.Template; unknown macros (2.11 has no ${pid}) kept.
  CHECK(LinePrefix("$role_name-$rank-$local_rank-${pid}:", "h", "default", 0, 0) ==
        "default-0-0-${pid}:");
  CHECK(LinePrefix("$ranks $$rank ${rank", "h", "d", 3, 0) == "$ranks $rank ${rank");
  CHECK(LinePrefix("cost $5 $", "h", "d", 3, 0) == "cost $5 $");
}

TEST_CASE("log pump: prefixed whole lines, raw files, the tail", "[unit]") {
  Console console;
  TempDir d;
  const std::string file = d.path + "/out.log";
  LogPump pump;
  LogPump::Sink sink;
  sink.file_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  sink.console_fd = console.wr;
  sink.prefix = "[n:3:1]:";
  sink.tail_lines = 3;
  auto w = pump.Add(7, sink);
  REQUIRE(w.ok());
  Write(*w, "hel");
  REQUIRE(pump.Sync(milliseconds(2000)));
  CHECK(console.Read().empty());  // no whole line yet
  Write(*w, "lo\nwor");
  Write(*w, "ld\nprogress 1%\rprogress 2%\r\nl4\nl5\npartial");
  REQUIRE(pump.Sync(milliseconds(2000)));
  CHECK(console.Read() ==
        "[n:3:1]:hello\n[n:3:1]:world\n[n:3:1]:progress 1%\r[n:3:1]:progress 2%\r\n"
        "[n:3:1]:l4\n[n:3:1]:l5\n");
  // The tail keeps the last 3 whole lines and the partial one; '\r' redraws.
  CHECK(pump.Tail(7) == std::vector<std::string>{"progress 2%", "l4", "l5", "partial"});
  ::close(*w);
  pump.CloseAll(milliseconds(2000));
  CHECK(console.Read() == "[n:3:1]:partial\n");  // flushed at the end
  // The file has the bytes exactly as written.
  CHECK(Slurp(file) == "hello\nworld\nprogress 1%\rprogress 2%\r\nl4\nl5\npartial");
  CHECK(pump.Tail(99).empty());
}

TEST_CASE("log pump: raw passthrough, many streams, lines never mixed", "[unit]") {
  Console console;
  LogPump pump;
  LogPump::Sink raw;
  raw.console_fd = console.wr;
  auto a = pump.Add(0, raw);
  REQUIRE(a.ok());
  Write(*a, "no newline");
  REQUIRE(pump.Sync(milliseconds(2000)));
  CHECK(console.Read() == "no newline");  // raw: as soon as it is read (progress bars)
  ::close(*a);

  // Eight prefixed writers, each line written in two halves: every line on
  // the console is whole and carries its writer's prefix.
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    LogPump::Sink s;
    s.console_fd = console.wr;
    s.prefix = "[w" + std::to_string(i) + "]:";
    auto fd = pump.Add(10 + i, s);
    REQUIRE(fd.ok());
    fds.push_back(*fd);
  }
  std::string all;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 8; ++i) Write(fds[i], "line " + std::to_string(round) + " of ");
    for (int i = 0; i < 8; ++i) Write(fds[i], "w" + std::to_string(i) + "\n");
    REQUIRE(pump.Sync(milliseconds(2000)));
    all += console.Read();
  }
  for (int fd : fds) ::close(fd);
  pump.CloseAll(milliseconds(2000));
  all += console.Read();
  int lines = 0;
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    ++lines;
    REQUIRE(line.size() > 5);
    const std::string w = line.substr(1, line.find(']') - 1);  // "[w3]:line 7 of w3"
    CHECK(line.substr(line.size() - w.size() - 4) == " of " + w);
  }
  CHECK(lines == 400);
}

TEST_CASE("log pump: a console that went away only stops the console copy", "[unit]") {
  LogPump pump;
  Console console;
  ::close(console.rd);  // nobody reads: writes get EPIPE (SIGPIPE is blocked in the pump)
  console.rd = -1;
  LogPump::Sink s;
  s.console_fd = console.wr;
  s.prefix = "[x]:";
  s.tail_lines = 2;
  auto fd = pump.Add(1, s);
  REQUIRE(fd.ok());
  Write(*fd, "a\nb\nc\n");
  REQUIRE(pump.Sync(milliseconds(2000)));
  CHECK(pump.Tail(1) == std::vector<std::string>{"b", "c"});
  ::close(*fd);
}

TEST_CASE("worker logs: torchrun's layout, one attempt directory per round", "[unit]") {
  TempDir d;
  Console out, err;
  WorkerLogs::Options o;
  o.spec.redirects = *ParseStdStreams("1");
  o.spec.tee = *ParseStdStreams("0:2");
  o.log_dir = d.path + "/logs";
  o.job_id = "job7";
  o.host = "node1";
  o.role = "default";
  o.console_out = out.wr;
  o.console_err = err.wr;
  {
    WorkerLogs logs(o);
    REQUIRE(logs.Init().ok());
    CHECK_FALSE(logs.is_temporary());
    logs.BeginRound(3);
    SpawnSpec spec0, spec1;
    std::string ef0, ef1;
    REQUIRE(logs.Prepare(0, 4, &spec0, &ef0).ok());
    REQUIRE(logs.Prepare(1, 5, &spec1, &ef1).ok());
    // torchrun's <run_id>_<8 random characters> (tempfile.mkdtemp in --log_dir).
    const std::string run = logs.run_dir();
    CHECK(run.rfind(d.path + "/logs/job7_", 0) == 0);
    CHECK(run.size() == (d.path + "/logs/job7_").size() + 8);
    const std::string a = run + "/attempt_3/";
    CHECK(ef0 == a + "0/error.json");
    CHECK(ef1 == a + "1/error.json");
    // stdout: redirected only, so the child writes the file itself.
    CHECK(spec0.stdout_path == a + "0/stdout.log");
    CHECK(spec0.stdout_fd < 0);
    // stderr of rank 0: teed through the pump (file + prefixed console);
    // of rank 1: the console, through the pump for its tail.
    REQUIRE(spec0.stderr_fd >= 0);
    REQUIRE(spec1.stderr_fd >= 0);
    CHECK(spec1.stderr_path.empty());
    Write(spec0.stderr_fd, "e0\n");
    Write(spec1.stderr_fd, "e1\n");
    logs.AfterSpawn(1);
    logs.Sync();
    CHECK(err.Read() == "[default0]:e0\ne1\n");
    CHECK(logs.StderrTail(1) == "e1");
    CHECK(logs.LogFile(0) == a + "0/stderr.log");
    CHECK(logs.LogFile(1) == a + "1/stdout.log");
    CHECK(Slurp(a + "0/stderr.log") == "e0\n");

    // The next restart count gets its own directory.
    logs.BeginRound(4);
    SpawnSpec spec2;
    std::string ef2;
    REQUIRE(logs.Prepare(0, 0, &spec2, &ef2).ok());
    logs.AfterSpawn(0);
    CHECK(ef2 == run + "/attempt_4/0/error.json");
    CHECK(fs::exists(a + "0/stderr.log"));  // the old round's logs stay
  }

  // A bad --log_dir is one clear error.
  o.log_dir = "/proc/no/such/dir";
  WorkerLogs bad(o);
  absl::Status st = bad.Init();
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Contains("cannot use --log_dir '/proc/no/such/dir'"));
}

TEST_CASE("worker logs: the temporary directory goes unless it holds logs", "[unit]") {
  TempDir d;
  ::setenv("TMPDIR", d.path.c_str(), 1);
  std::string dir, run;
  {
    WorkerLogs::Options o;
    o.job_id = "j";
    WorkerLogs logs(o);
    REQUIRE(logs.Init().ok());
    CHECK(logs.is_temporary());
    dir = logs.log_dir();
    CHECK(dir.rfind(d.path + "/ddprun_", 0) == 0);
    logs.BeginRound(0);
    SpawnSpec spec;
    std::string ef;
    REQUIRE(logs.Prepare(0, 0, &spec, &ef).ok());
    logs.AfterSpawn(0);
    // TORCHELASTIC_ERROR_FILE always set; with only error files in a
    // temporary directory, they lie flat in it (no per-rank tree).
    CHECK(ef == dir + "/attempt_0_rank_0_error.json");
    CHECK(fs::is_directory(dir));
    CHECK_FALSE(fs::exists(dir + "/j"));
    std::ofstream(ef) << "{}";  // what torch's error handler writes
    logs.BeginRound(1);
    REQUIRE(logs.Prepare(1, 1, &spec, &ef).ok());
    CHECK(ef == dir + "/attempt_1_rank_1_error.json");
  }
  CHECK_FALSE(fs::exists(dir));  // only error files: removed
  {
    WorkerLogs::Options o;
    o.job_id = "j";
    o.spec.redirects = *ParseStdStreams("3");
    WorkerLogs logs(o);
    REQUIRE(logs.Init().ok());
    dir = logs.log_dir();
    run = logs.run_dir();
    CHECK(run.rfind(dir + "/j_", 0) == 0);
    logs.BeginRound(0);
    SpawnSpec spec;
    std::string ef;
    REQUIRE(logs.Prepare(0, 0, &spec, &ef).ok());
    CHECK(spec.stdout_path == run + "/attempt_0/0/stdout.log");
    logs.AfterSpawn(0);
  }
  CHECK(fs::exists(run + "/attempt_0/0/stderr.log"));  // logs: kept
  ::unsetenv("TMPDIR");
}

TEST_CASE("worker logs: without TMPDIR, error files only go to tmpfs, logs to /tmp", "[unit]") {
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("TMPDIR");
  const bool shm_writable = ::access("/dev/shm", W_OK | X_OK) == 0;
  std::string dir;
  {
    WorkerLogs::Options o;
    o.job_id = "j";
    WorkerLogs logs(o);
    REQUIRE(logs.Init().ok());
    dir = logs.log_dir();
    CHECK(dir.rfind(shm_writable ? "/dev/shm/ddprun_" : "/tmp/ddprun_", 0) == 0);
    logs.BeginRound(0);
    SpawnSpec spec;
    std::string ef;
    REQUIRE(logs.Prepare(0, 0, &spec, &ef).ok());
    logs.AfterSpawn(0);
    CHECK(ef == dir + "/attempt_0_rank_0_error.json");
  }
  CHECK_FALSE(fs::exists(dir));
  {
    WorkerLogs::Options o;
    o.job_id = "j";
    o.spec.redirects = *ParseStdStreams("3");
    WorkerLogs logs(o);
    REQUIRE(logs.Init().ok());
    dir = logs.log_dir();
    CHECK(dir.rfind("/tmp/ddprun_", 0) == 0);  // log files never go to memory
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (saved != nullptr) ::setenv("TMPDIR", saved_value.c_str(), 1);
}

}  // namespace
}  // namespace ddprun::agent
