#include "ddprun/rendezvous/ha/job_snapshot_proto.h"

#include "ddprun/rendezvous/proto_convert.h"

namespace ddprun::rendezvous {

void SnapshotToProto(const JobSnapshot& s, pb::JobSnapshot* p) {
  p->set_format_version(kFormatVersion);
  p->set_job_id(s.job_id);
  p->set_store_token(s.store_token);
  p->set_shaped(s.shaped);
  *p->mutable_shape() = ToProto(s.shape);
  p->set_state(s.state);
  p->set_round(s.round);
  p->set_restart_count(s.restart_count);
  for (const auto& m : s.members) {
    auto* q = p->add_members();
    q->set_node_id(m.node_id);
    *q->mutable_spec() = ToProto(m.spec);
    q->set_done(m.done);
  }
  for (std::size_t i = 0; i < s.assigned.size(); ++i) {
    auto* n = p->add_assigned();
    ToProto(s.assigned[i], n);
  }
  for (const auto& f : s.failures) ToProto(f, p->add_failures());
  p->set_close_reason(s.close_reason);
  p->set_close_success(s.close_success);
  for (const auto& e : s.expected) p->add_expected(e);
  for (const auto& id : s.assigned_ids) p->add_assigned_ids(id);
}

JobSnapshot SnapshotFromProto(const pb::JobSnapshot& p) {
  JobSnapshot s;
  s.job_id = p.job_id();
  s.store_token = p.store_token();
  s.shaped = p.shaped();
  s.shape = FromProto(p.shape());
  s.state = p.state();
  s.round = p.round();
  s.restart_count = p.restart_count();
  for (const auto& m : p.members())
    s.members.push_back({m.node_id(), FromProto(m.spec()), m.done()});
  for (const auto& n : p.assigned()) s.assigned.push_back(FromProto(n));
  for (const auto& f : p.failures()) s.failures.push_back(FromProto(f));
  s.close_reason = p.close_reason();
  s.close_success = p.close_success();
  s.expected.assign(p.expected().begin(), p.expected().end());
  s.assigned_ids.assign(p.assigned_ids().begin(), p.assigned_ids().end());
  return s;
}

}  // namespace ddprun::rendezvous
