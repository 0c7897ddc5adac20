// A job's persisted state (JobSnapshot, job_rendezvous.h) <-> its proto
// (proto/ddprun/v1/state.proto), shared by the two journals: StateLog
// (--state_dir) and EtcdJournal (--etcd_endpoints).
#pragma once

#include <cstdint>

#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/proto_convert.h"
#include "ddprun/v1/state.pb.h"

namespace ddprun::rendezvous {

inline constexpr std::uint32_t kFormatVersion = 1;

void SnapshotToProto(const JobSnapshot& s, pb::JobSnapshot* p);
JobSnapshot SnapshotFromProto(const pb::JobSnapshot& p);

}  // namespace ddprun::rendezvous
