// A finished job's ranks (issue 33, item 2): after a job ends, ddprund's
// /api/v1/jobs/<job> and `ddprun top --once` show each rank's end state
// (exited, failed, stopped; docs/monitoring.md) and an age that no longer
// grows. Real ddprund, a real agent, real workers.
#include <regex>
#include <string>

#include "nlohmann/json.hpp"
#include "support/http_get.h"
#include "support/process_helpers.h"

using namespace ddprun::test;
using nlohmann::json;

namespace {

// The job's document once the job has ended (the job's own state is right
// before this fix too; the ranks are what is checked).
json EndedJob(int dashboard, const std::string& job) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < 20) {
    auto [code, body] = Http(dashboard, "/api/v1/jobs/" + job);
    if (code == 200) {
      json j = json::parse(body);
      const std::string state = j.value("state", "");
      if (state == "failed" || state == "succeeded") return j;
    }
    SleepMs(100);
  }
  FAIL("job " << job << " did not end within 20 s");
  return {};
}

std::string RankState(const json& doc, int rank) {
  for (const json& r : doc["ranks"])
    if (r["rank"].get<int>() == rank) return r["state"].get<std::string>();
  return "<no rank " + std::to_string(rank) + ">";
}

// `ddprun top --once` rows: rank number -> the row's text.
std::string TopRow(const std::string& out, int rank) {
  for (const std::string& line : Lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, std::regex("^ +([0-9]+) +127\\.0\\.0\\.[0-9]+ ")) &&
        std::stoi(m[1]) == rank) {
      return line;
    }
  }
  return "";
}

}  // namespace

TEST_CASE(
    "finished ranks: a failed job shows the failed rank failed, the others stopped, "
    "in the HTTP API and ddprun top, with ages that stop",
    "[multiproc][end_state]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const int dashboard = DashboardPort(*daemon);
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // Rank 1 fails after its first reports; rank 0 would run for a minute.
  const std::string script = "if [ \"$RANK\" = 1 ]; then sleep 3; exit 7; fi; sleep 60";
  Proc& a = h.StartDdprun(
      "a", {"--nnodes=1", "--nproc_per_node=2", "--max_restarts=0", "--rdzv_endpoint=" + endpoint,
            "--rdzv_id=ended-failed", "--no_python", "sh", "-c", script});
  CHECK(h.Wait(a, 60) != 0);
  const json doc = EndedJob(dashboard, "ended-failed");
  INFO(doc.dump(1));
  CHECK(doc["state"] == "failed");
  CHECK(RankState(doc, 0) == "stopped");
  CHECK(RankState(doc, 1) == "failed");
  // The age is frozen at the job's end: a second later it has not grown.
  SleepMs(1500);
  const json later = EndedJob(dashboard, "ended-failed");
  for (std::size_t i = 0; i < doc["ranks"].size(); ++i) {
    CHECK(later["ranks"][i]["age_s"].get<double>() == doc["ranks"][i]["age_s"].get<double>());
  }

  Proc& top = h.Start(
      "top", {Ddprun(), "top", "--rdzv_endpoint", endpoint, "--job", "ended-failed", "--once"});
  h.Wait(top, 30);
  INFO(top.Out() << top.Err());
  CHECK_THAT(TopRow(top.Out(), 0), Catch::Contains("stopped"));
  CHECK_THAT(TopRow(top.Out(), 1), Catch::Contains("failed"));
  h.StopDaemon(*daemon);
}

TEST_CASE("finished ranks: a job that succeeded shows every rank exited",
          "[multiproc][end_state]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const int dashboard = DashboardPort(*daemon);
  Proc& a = h.StartDdprun(
      "a", {"--nnodes=1", "--nproc_per_node=2", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
            "--rdzv_id=ended-ok", "--no_python", "sh", "-c", "sleep 2"});
  CHECK(h.Wait(a, 60) == 0);
  const json doc = EndedJob(dashboard, "ended-ok");
  INFO(doc.dump(1));
  CHECK(doc["state"] == "succeeded");
  CHECK(RankState(doc, 0) == "exited");
  CHECK(RankState(doc, 1) == "exited");
  h.StopDaemon(*daemon);
}
