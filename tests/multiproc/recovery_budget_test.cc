// The recovery budget's records that do not recover (docs/recovery.md), with
// real processes: a worker that fails in every attempt supersedes each
// restart's record with the next failure, and the last restart's record is
// closed by the job's end; the failure report lists them all.
#include <regex>
#include <string>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE(
    "recovery budget: a failure during recovery supersedes the record, the job's end "
    "closes the last, and the failure report lists both",
    "[multiproc][recovery]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  // Rank 1 exits 7 after 300 ms in every attempt; rank 0 would run 300 ms too.
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", "--max_restarts=2", "--rdzv_id=rb", FixtureWorker()},
      {{"FIXTURE_PIDFILE_DIR", pids},
       {"FIXTURE_FAIL_RANK", "1"},
       {"FIXTURE_EXIT_CODE", "7"},
       {"FIXTURE_SLEEP_MS", "300"}});
  const int rc = h.Wait(p, 60);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 1);
  const std::string phases = "detected \\+0, stopped \\+[0-9]+, round \\+[0-9]+, started \\+[0-9]+";
  // Round 1's workers failed before a step: the console says round 0's
  // record was superseded, and so does the report.
  const std::string superseded =
      "\\[job rb round 1\\] recovery from round 0 \\(worker rank 1 exited with exit code 7\\) "
      "superseded by another failure: " +
      phases;
  CHECK(std::regex_search(err, std::regex("\nddprun: " + superseded + "\n")));
  CHECK(std::regex_search(err, std::regex("\nddprun:   recovery: " + superseded + "\n")));
  // Round 2 was the last attempt: no new record; round 1's was still open
  // when the job ended.
  CHECK(std::regex_search(
      err, std::regex("\nddprun:   recovery: \\[job rb round 2\\] recovery from round 1 \\(worker "
                      "rank 1 exited with exit code 7\\) saw no first step before the job ended: " +
                      phases + "\n")));
  CHECK(err.find("recovered in") == std::string::npos);
  CHECK(err.find("round 3") == std::string::npos);
  h.RequireAllGone(pids, 2);
}
