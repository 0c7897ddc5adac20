// BackgroundThreads (background_priority.h) on real threads: a member is
// named and confined when it joins, SetCpus moves the members present, and
// an empty set gives back the caller's whole affinity. What the kernel
// reports (/proc/self/task/<tid>/) is what is checked; the agent's threads
// under a real job are checked in tests/e2e/checkpoint_replica_test.cc.
#include "ddprun/agent/background_priority.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <thread>

#include "ddprun/agent/cpu_binding.h"
#include "support/skip.h"

namespace ddprun::agent {
namespace {

// A /proc/self/task/<tid>/status field, or the comm file ("comm").
std::string TaskField(pid_t tid, const std::string& field) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid) + "/";
  std::string line;
  if (field == "comm") {
    std::ifstream f(dir + "comm");
    std::getline(f, line);
    return line;
  }
  std::ifstream f(dir + "status");
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      const auto at = line.find_first_not_of(" \t", field.size() + 1);
      return at == std::string::npos ? "" : line.substr(at);
    }
  }
  return "";
}

// A member thread of `owner` named `name` that runs until `stop`.
struct MemberThread {
  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread thread;
  MemberThread(BackgroundThreads* owner, const char* name) {
    thread = std::thread([this, owner, name] {
      const BackgroundThreads::Member member(owner, name);
      tid = static_cast<pid_t>(::syscall(SYS_gettid));
      while (!stop) std::this_thread::yield();
    });
    while (tid == 0) std::this_thread::yield();
  }
  ~MemberThread() {
    stop = true;
    thread.join();
  }
};

}  // namespace

TEST_CASE("background threads: named, confined on joining and by SetCpus, freed by an empty set",
          "[unit]") {
  const std::vector<int> all = ReadAffinity();
  if (all.size() < 2) return test::SkipCase("unit", "fewer than 2 usable CPUs");
  const std::string whole = FormatCpuList(all);
  const std::vector<int> last{all.back()};
  BackgroundThreads threads;
  // Before any SetCpus a member keeps what it inherited.
  MemberThread early(&threads, kSendThreadName);
  CHECK(TaskField(early.tid, "comm") == "ckpt-send");
  CHECK(TaskField(early.tid, "Cpus_allowed_list") == whole);
  // SetCpus moves the member present; a later one joins confined.
  REQUIRE(threads.SetCpus(last).ok());
  CHECK(threads.cpus() == last);
  CHECK(TaskField(early.tid, "Cpus_allowed_list") == FormatCpuList(last));
  {
    MemberThread late(&threads, kReceiveThreadName);
    CHECK(TaskField(late.tid, "comm") == "ckpt-recv");
    CHECK(TaskField(late.tid, "Cpus_allowed_list") == FormatCpuList(last));
  }
  // The calling (main) thread is never moved.
  CHECK(FormatCpuList(ReadAffinity()) == whole);
  // An empty set: every member back on the caller's whole affinity.
  REQUIRE(threads.SetCpus({}).ok());
  CHECK(threads.cpus().empty());
  CHECK(TaskField(early.tid, "Cpus_allowed_list") == whole);
  // Without an owner a thread is only named.
  MemberThread alone(nullptr, kPersistThreadName);
  CHECK(TaskField(alone.tid, "comm") == "ckpt-persist");
  CHECK(TaskField(alone.tid, "Cpus_allowed_list") == whole);
}

}  // namespace ddprun::agent
