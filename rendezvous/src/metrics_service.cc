#include "metrics_service.h"

#include "ddprun/rendezvous/metrics_json.h"
#include "proto_convert.h"

namespace ddprun::rendezvous {
namespace {

// The proto report as the hub's domain type, bounded before copying: at
// most as many ranks and stacks as a node can have, events cut by the hub.
MetricsReport FromProto(const pb::MetricsReport& p) {
  MetricsReport r;
  r.job_id = p.job_id();
  r.node_id = p.node_id();
  r.round = p.round();
  r.host = p.host();
  r.unix_s = p.unix_s();
  const int max_ranks = 65536;
  for (int i = 0; i < p.ranks_size() && i < max_ranks; ++i) {
    const auto& s = p.ranks(i);
    RankSample x;
    x.rank = s.rank();
    x.local_rank = s.local_rank();
    x.pid = s.pid();
    x.state = s.state().substr(0, 32);
    x.has_progress_source = s.has_progress_source();
    x.steps = s.steps();
    const int n = std::min(s.step_seconds_size(), static_cast<int>(kMaxStepSecondsPerReport));
    x.step_seconds.assign(s.step_seconds().end() - n, s.step_seconds().end());
    x.samples_total = s.samples_total();
    x.collective_seq = s.collective_seq();
    x.in_collective = s.in_collective();
    x.collective_op = s.collective_op().substr(0, 256);
    x.comm_seconds_total = s.comm_seconds_total();
    for (int c = 0; c < s.collectives_size() && c <= static_cast<int>(kMaxCollectiveOps); ++c) {
      const auto& cs = s.collectives(c);
      x.collectives.push_back({cs.op().substr(0, 256), cs.count(), cs.bytes_total(),
                               cs.seconds_total(), cs.busbw_gbps()});
    }
    std::size_t kept = 0;
    for (const auto& [k, v] : s.scalars()) {
      // The hub keeps kMaxScalarsPerRank valid ones; copy a bounded number.
      if (kept++ >= 4 * kMaxScalarsPerRank || k.size() > kMaxScalarNameBytes) {
        ++x.scalars_dropped;
        continue;
      }
      x.scalars.emplace(k, v);
    }
    x.scalars_dropped += s.scalars_dropped();
    x.cpu_percent = s.cpu_percent();
    x.rss_bytes = s.rss_bytes();
    x.gpu_util_percent = s.gpu_util_percent();
    x.gpu_mem_bytes = s.gpu_mem_bytes();
    r.ranks.push_back(std::move(x));
  }
  for (int i = 0; i < p.stacks_size() && i < 64; ++i) {
    const auto& d = p.stacks(i);
    r.stacks.push_back({d.rank(), d.pid(), d.host().substr(0, 1024), d.kind().substr(0, 64),
                        d.text().substr(0, kMaxStackBytes), d.error().substr(0, kMaxEventBytes)});
  }
  for (int i = 0; i < p.events_size() && i < static_cast<int>(kMaxEventsPerReport); ++i) {
    r.events.push_back(p.events(i).substr(0, kMaxEventBytes));
  }
  return r;
}

}  // namespace

grpc::ServerUnaryReactor* HandleReportMetrics(MetricsHub& hub, grpc::CallbackServerContext* ctx,
                                              const pb::MetricsReport* req,
                                              pb::MetricsReply* resp) {
  auto* reactor = ctx->DefaultReactor();
  auto reply = hub.Report(FromProto(*req));
  if (reply.ok()) {
    for (int r : reply->capture_stacks) resp->add_capture_stacks(r);
    resp->set_hang_report(reply->hang_report);
  }
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
