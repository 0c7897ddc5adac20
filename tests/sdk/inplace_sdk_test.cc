// Issue 29's SDK end to end: the in-place SDK trainer (tests/sdk/worker/
// inplace_trainer.cc) under the real ddprun with --restart_policy=inplace
// and 4 ranks; rank 2 kill -9's itself at step 50. The survivors must keep
// their processes (one start each, the same pid at the end, one re-form),
// the replacement resumes from the checkpoint every rank agreed on, and the
// final parameters equal those of a fault-free run bit for bit, on both CPU
// transports.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

struct Run {
  int rc = -1;
  std::string err;
  std::string out_prefix;
};

Run Train(Harness& h, const std::string& name, const std::string& shm, int kill_rank) {
  const std::string out = h.dir() + "/" + name;
  Proc& p = h.StartDdprun(name,
                          {"--nproc_per_node=4", "--restart_policy=inplace", "--max_restarts=3",
                           "--no_python", Bin("inplace_trainer")},
                          {{"TRAINER_OUT", out},
                           {"TRAINER_STEPS", "120"},
                           {"TRAINER_KILL_RANK", std::to_string(kill_rank)},
                           {"TRAINER_KILL_STEP", "50"},
                           {"DDP_SHM", shm},
                           {"DDP_TIMEOUT_SEC", "30"}});
  Run r;
  r.rc = h.Wait(p, 240);
  r.err = p.Err() + "\n" + p.Out();
  r.out_prefix = out;
  return r;
}

std::string Field(const std::string& report, const std::string& key) {
  const std::size_t at = report.find(key + "=");
  if (at == std::string::npos) return "";
  const std::size_t end = report.find('\n', at);
  return report.substr(at + key.size() + 1, end - at - key.size() - 1);
}

}  // namespace

TEST_CASE(
    "SDK trainer under --restart_policy=inplace: survivors keep their pids, the result "
    "equals a fault-free run",
    "[sdk]") {
  for (const char* shm : {"1", "0"}) {
    DYNAMIC_SECTION((std::string(shm) == "1" ? "shm" : "tcp")) {
      Harness h;
      const Run clean = Train(h, "clean", shm, -1);
      INFO("fault-free run:\n" << clean.err);
      REQUIRE(clean.rc == 0);
      const std::string digest = Field(ReadFile(clean.out_prefix + ".0"), "digest");
      REQUIRE(!digest.empty());
      const Run faulty = Train(h, "faulty", shm, 2);
      INFO("run with a kill -9:\n" << faulty.err);
      REQUIRE(faulty.rc == 0);
      for (int r = 0; r < 4; ++r) {
        const std::string report = ReadFile(faulty.out_prefix + "." + std::to_string(r));
        const std::vector<std::string> starts =
            Lines(ReadFile(faulty.out_prefix + "." + std::to_string(r) + ".start"));
        INFO("rank " << r << " report:\n" << report);
        REQUIRE(Field(report, "digest") == digest);
        if (r == 2) {
          REQUIRE(starts.size() == 2);  // the victim, then its replacement
          REQUIRE(Field(report, "pid") == starts.back());
        } else {
          REQUIRE(starts.size() == 1);  // never restarted as a process
          REQUIRE(Field(report, "pid") == starts.front());
          REQUIRE(Field(report, "reforms") == "1");
        }
      }
      // Each survivor's PeerLostError names rank 2, or no rank (-1) when it
      // could not agree with the others on one; never a survivor. Over TCP
      // a slow survivor used to name the survivor whose connections closed
      // on it, once the round's store had gone with the round.
      int lost_lines = 0;
      for (const std::string& line : Lines(faulty.err)) {
        const std::size_t at = line.find("lost: rank=");
        if (at == std::string::npos) continue;
        ++lost_lines;
        INFO(line);
        const std::string named = Field(line.substr(at), "lost_rank");
        CHECK((named.rfind("2 ", 0) == 0 || named.rfind("-1 ", 0) == 0));
      }
      CHECK(lost_lines == 3);
    }
  }
}
