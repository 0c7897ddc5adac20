// ddprun status: the daemon's quarantined hosts appear in the table and in JSON.
#include "ddprun/launcher/client/status_command.h"

#include <catch2/catch.hpp>
#include <string>

namespace ddprun::launcher {
namespace {

TEST_CASE("ddprun status shows quarantined hosts and why, as text and JSON", "[unit]") {
  rendezvous::JobStatus j;
  j.job_id = "q";
  j.round = 3;
  j.state = "running";
  j.restart_count = 2;
  j.world_size = 2;
  j.nodes = {{0, "127.0.0.1", 100, 2, 0}};
  j.quarantined = {"127.0.0.2: 2 worker failures, 59 s left",
                   "bad\"host: 3 worker failures, 1 s left"};

  const std::string text = FormatStatusText({j});
  CHECK(text.find("  quarantined 127.0.0.2: 2 worker failures, 59 s left\n") != std::string::npos);
  CHECK(text.find("  quarantined bad\"host: 3 worker failures, 1 s left\n") != std::string::npos);
  // The job line comes first, then its quarantined hosts, then its nodes.
  CHECK(text.find("quarantined") > text.find("\nq "));
  CHECK(text.find("quarantined") < text.find("  node 0"));

  const std::string json = FormatStatusJson("h:1", {j});
  CHECK(json.find("\"waiting\":0,\"quarantined\":[\"127.0.0.2: 2 worker failures, 59 s left\","
                  "\"bad\\\"host: 3 worker failures, 1 s left\"],\"nodes\":[") !=
        std::string::npos);

  // No quarantine: no extra text line, an empty JSON list.
  j.quarantined.clear();
  CHECK(FormatStatusText({j}).find("quarantined") == std::string::npos);
  CHECK(FormatStatusJson("h:1", {j}).find("\"quarantined\":[]") != std::string::npos);
}

TEST_CASE("ddprun status shows a gathering round's wait and its deadline", "[unit]") {
  rendezvous::JobStatus j;
  j.job_id = "fixed";
  j.round = 1;
  j.state = "gathering";
  j.nodes = {{-1, "127.0.0.1", 100, 1, -1}};
  j.min_nodes = j.max_nodes = 2;
  j.join_deadline_in_s = 42.7;
  const std::string text = FormatStatusText({j});
  const std::size_t at = text.find("  waiting for 2 nodes (1 of 2 have joined); the round fails at ");
  REQUIRE(at != std::string::npos);
  CHECK(text.find(" (in 42 s) unless they join\n", at) != std::string::npos);
  CHECK(at < text.find("  node -"));
  CHECK(FormatStatusJson("h:1", {j}).find(
            "\"min_nodes\":2,\"max_nodes\":2,\"join_deadline_in_s\":42.7}") != std::string::npos);
  // Running, or no deadline: no such line.
  j.state = "running";
  CHECK(FormatStatusText({j}).find("waiting for") == std::string::npos);
  j.state = "gathering";
  j.join_deadline_in_s = 0;
  CHECK(FormatStatusText({j}).find("waiting for") == std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher
