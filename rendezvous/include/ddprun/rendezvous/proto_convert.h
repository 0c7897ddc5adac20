// The one place where ddprun.v1 protos map to and from domain types, and
// where absl::Status maps to and from grpc::Status.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "ddprun/rendezvous/common/types.h"
#include "ddprun/rendezvous/monitoring/metrics_types.h"
#include "ddprun/v1/ddprun.pb.h"

namespace ddprun::rendezvous {

namespace pb = ::ddprun::v1;

// The largest message a ddprun server or client sends or accepts.
inline constexpr int kMaxMessageBytes = 8 << 20;

// Once per process, before the first channel or server: routes gRPC's
// internal logging away from the console (see proto_convert.cc), and turns off
// absl's Mutex deadlock detection, which a library built without NDEBUG (as
// Debian's absl is) runs on every lock over one process-wide graph: the
// 16k-agent rendezvous spent a third of its time there.
void SilenceGrpcLogging();

// Code and message map one to one; the status payloads (the error kind,
// errors.h) travel as pb::ErrorDetails in the error details, so that
// KindOf(FromGrpc(ToGrpc(s))) == KindOf(s).
grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);
// Whether a ddprun server produced the status (an error with ErrorDetails),
// rather than gRPC itself (a transport failure, the client's own deadline).
bool SentByServer(const grpc::Status& s);

StoreScope FromProto(const pb::StoreScope& p);

// The job policy: proto3's zeros where a field is absent (an old agent's
// request then fails validation, as before); an unknown on_hang is report.
JobPolicy FromProto(const pb::JobPolicy& p);
void ToProto(const JobPolicy& s, pb::JobPolicy* p);

JoinSpec FromProto(const pb::JoinRequest& p);
pb::JoinRequest ToProto(const JoinSpec& s);

WorkerFailure FromProto(const pb::WorkerFailure& p);
void ToProto(const WorkerFailure& f, pb::WorkerFailure* p);

NodeInfo FromProto(const pb::NodeInfo& p);
void ToProto(const NodeInfo& n, pb::NodeInfo* p);

// RoundEvent's Status alternative is not a message: it ends the stream.
pb::RoundEvent ToProto(const RoundEvent& e);
RoundEvent FromProto(const pb::RoundEvent& p);

pb::ReportRequest::Outcome ToProto(Outcome o);
Outcome FromProto(pb::ReportRequest::Outcome o);

void ToProto(const JobStatus& s, pb::JobStatus* p);
JobStatus FromProto(const pb::JobStatus& p);

// Monitoring: what an agent sends and what it gets back.
void ToProto(const RankSample& r, pb::RankSample* p);
void ToProto(const StackDump& d, pb::StackDump* p);
pb::MetricsReport ToProto(const MetricsReport& r);
MetricsReply FromProto(const pb::MetricsReply& p);
// The server's side. The report is bounded while it is copied (ranks, step
// durations, scalars, stacks, events: metrics_hub.h's limits); the hub
// validates the rest.
MetricsReport FromProto(const pb::MetricsReport& p);
void ToProto(const MetricsReply& r, pb::MetricsReply* p);

}  // namespace ddprun::rendezvous
