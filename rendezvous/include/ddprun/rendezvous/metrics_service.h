// The gRPC glue of monitoring: the ReportMetrics and GetMetrics calls of the
// Rendezvous service, converted at the edge and answered by the MetricsHub.
// The Rendezvous service (rendezvous_services.cc) forwards to these.
#pragma once

#include <grpcpp/grpcpp.h>

#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "ddprun/v1/ddprun.grpc.pb.h"

namespace ddprun::rendezvous {

grpc::ServerUnaryReactor* HandleReportMetrics(MetricsHub& hub, grpc::CallbackServerContext* ctx,
                                              const ::ddprun::v1::MetricsReport* req,
                                              ::ddprun::v1::MetricsReply* resp);
grpc::ServerUnaryReactor* HandleGetMetrics(const MetricsHub& hub, grpc::CallbackServerContext* ctx,
                                           const ::ddprun::v1::MetricsQuery* req,
                                           ::ddprun::v1::MetricsView* resp);

}  // namespace ddprun::rendezvous
