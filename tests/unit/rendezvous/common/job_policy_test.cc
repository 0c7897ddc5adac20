#include "ddprun/rendezvous/common/job_policy.h"

#include <catch2/catch.hpp>

namespace ddprun::rendezvous {
namespace {

TEST_CASE("on_hang has one parser and one namer", "[job_policy]") {
  for (OnHang a : {OnHang::kReport, OnHang::kRestart, OnHang::kAbort}) {
    REQUIRE(ParseOnHang(OnHangName(a)) == a);
  }
  CHECK(ParseOnHang("") == OnHang::kReport);
  CHECK_FALSE(ParseOnHang("Restart").has_value());
  CHECK_FALSE(ParseOnHang("kill").has_value());
}

TEST_CASE("restart_policy has one parser and one namer", "[job_policy]") {
  for (RestartPolicy a : {RestartPolicy::kJob, RestartPolicy::kInplace}) {
    REQUIRE(ParseRestartPolicy(RestartPolicyName(a)) == a);
  }
  CHECK(JobPolicy{}.restart_policy == RestartPolicy::kJob);
  CHECK(ParseRestartPolicy("") == RestartPolicy::kJob);
  CHECK_FALSE(ParseRestartPolicy("in-place").has_value());
  CHECK_FALSE(ParseRestartPolicy("Inplace").has_value());
}

TEST_CASE("a node that asks for another restart_policy is told", "[job_policy]") {
  JobPolicy asked;
  asked.restart_policy = RestartPolicy::kInplace;
  const std::vector<PolicyDifference> d = PolicyDifferences(asked, JobPolicy{});
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "restart_policy");
  CHECK(d[0].asked == "inplace");
  CHECK(d[0].job == "job");
  CHECK(PolicyWarning("this node", asked, JobPolicy{}) ==
        "this node asked restart_policy=inplace, the job runs with job (the first node's); pass "
        "the same --restart_policy on every node");
}

TEST_CASE("a node that asks for another ckpt_replicas is told", "[job_policy]") {
  CHECK(JobPolicy{}.ckpt_replicas == 0);
  JobPolicy asked;
  asked.ckpt_replicas = 1;
  const std::vector<PolicyDifference> d = PolicyDifferences(asked, JobPolicy{});
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "ckpt_replicas");
  CHECK(d[0].asked == "1");
  CHECK(d[0].job == "0");
  CHECK(PolicyWarning("this node", JobPolicy{}, asked) ==
        "this node asked ckpt_replicas=0, the job runs with 1 (the first node's); pass "
        "the same --ckpt_replicas on every node");
}

TEST_CASE("a node that asks for another ckpt_encrypt is told", "[job_policy]") {
  CHECK(JobPolicy{}.ckpt_encrypt == 1);
  JobPolicy asked;
  asked.ckpt_encrypt = 0;
  CHECK(PolicyWarning("this node", asked, JobPolicy{}) ==
        "this node asked ckpt_encrypt=0, the job runs with 1 (the first node's); pass "
        "the same --ckpt_encrypt on every node");
}

TEST_CASE("the same policy differs in nothing", "[job_policy]") {
  CHECK(PolicyDifferences(JobPolicy{}, JobPolicy{}).empty());
  CHECK(PolicyWarning("this node", JobPolicy{}, JobPolicy{}).empty());
}

TEST_CASE("PolicyDifferences names each job-wide field that differs", "[job_policy]") {
  JobPolicy job;
  JobPolicy asked;
  asked.hang_timeout_s = 60;
  auto d = PolicyDifferences(asked, job);
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "hang_timeout");
  CHECK(d[0].asked == "60s");
  CHECK(d[0].job == "300s");
  CHECK(PolicyWarning("this node", asked, job) ==
        "this node asked hang_timeout=60s, the job runs with 300s (the first "
        "node's); pass the same --hang_timeout on every node");

  asked.on_hang = OnHang::kAbort;
  asked.last_call_timeout_s = 5;
  d = PolicyDifferences(asked, job);
  REQUIRE(d.size() == 3);
  CHECK(d[0].field == "last_call_timeout");
  CHECK(d[1].field == "hang_timeout");
  CHECK(d[2].field == "on_hang");
  CHECK(d[2].asked == "abort");
  CHECK(d[2].job == "report");
  CHECK(PolicyWarning("node h:7", asked, job) ==
        "node h:7 asked last_call_timeout=5s, hang_timeout=60s, "
        "on_hang=abort, the job runs with 30s, 300s, report (the first node's); pass the same "
        "--rdzv_conf last_call_timeout and --hang_timeout and --on_hang on every node");
}

TEST_CASE("join_timeout and max_restarts are not warned about", "[job_policy]") {
  JobPolicy asked;
  asked.join_timeout_s = 5;  // each node's own
  asked.max_restarts = 3;    // refused by the rendezvous instead
  CHECK(PolicyDifferences(asked, JobPolicy{}).empty());
}

}  // namespace
}  // namespace ddprun::rendezvous
