#include "ddprun/rendezvous/metrics_service.h"

#include "ddprun/rendezvous/monitoring/metrics_json.h"
#include "ddprun/rendezvous/proto_convert.h"

namespace ddprun::rendezvous {
grpc::ServerUnaryReactor* HandleReportMetrics(MetricsHub& hub, grpc::CallbackServerContext* ctx,
                                              const pb::MetricsReport* req,
                                              pb::MetricsReply* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto reply = hub.Report(FromProto(*req));
  if (reply.ok()) ToProto(*reply, resp);
  reactor->Finish(ToGrpc(reply.status()));
  return reactor;
}

grpc::ServerUnaryReactor* HandleGetMetrics(const MetricsHub& hub, grpc::CallbackServerContext* ctx,
                                           const pb::MetricsQuery* req, pb::MetricsView* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto view = hub.View(req->job_id());
  if (view.ok()) resp->set_json(JobViewJson(*view));
  reactor->Finish(ToGrpc(view.status()));
  return reactor;
}

}  // namespace ddprun::rendezvous
