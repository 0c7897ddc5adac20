// The JobPolicy conversion (proto_convert.cc): whole both ways, and the
// pre-JobPolicy fields read when `policy` is absent, as in job state saved by
// an older ddprund (--state_dir, etcd) or an older agent's join.
#include <catch2/catch.hpp>

#include "ddprun/rendezvous/proto_convert.h"

namespace ddprun::rendezvous {
namespace {

TEST_CASE("JobPolicy survives the proto both ways", "[proto_convert][job_policy]") {
  JoinSpec s;
  s.job_id = "j";
  s.policy.max_restarts = 7;
  s.policy.join_timeout_s = 12.5;
  s.policy.last_call_timeout_s = 3;
  s.policy.hang_timeout_s = 0;
  s.policy.on_hang = OnHang::kAbort;
  s.policy.restart_policy = RestartPolicy::kInplace;
  s.policy.ckpt_replicas = 1;
  s.policy.ckpt_encrypt = 0;  // not its default: the field crosses
  pb::JoinRequest p = ToProto(s);
  REQUIRE(p.has_policy());
  CHECK(FromProto(p).policy == s.policy);
}

TEST_CASE("A join written before JobPolicy keeps its policy", "[proto_convert][job_policy]") {
  pb::JoinRequest p;
  p.set_job_id("old");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  p.set_legacy_max_restarts(3);
  p.set_legacy_join_timeout_s(45);
  p.set_legacy_last_call_timeout_s(9);
  p.set_legacy_hang_timeout_s(120);
  p.set_legacy_on_hang("restart");
#pragma GCC diagnostic pop
  JobPolicy want;
  want.max_restarts = 3;
  want.join_timeout_s = 45;
  want.last_call_timeout_s = 9;
  want.hang_timeout_s = 120;
  want.on_hang = OnHang::kRestart;
  CHECK(FromProto(p).policy == want);
}

}  // namespace
}  // namespace ddprun::rendezvous
