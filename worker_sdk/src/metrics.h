// The process's metrics channel (ddp/metrics.h), for the SDK's own
// recording of collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ddprun/rendezvous/monitoring/metrics_channel.h"

namespace ddp::detail {

struct OpDesc;  // backend.h

// The channel named by DDPRUN_METRICS_FILE, opened once per process; null
// when there is none.
ddprun::rendezvous::ChannelWriter* MetricsChannel();

// Bus bandwidth in GB/s of one collective, as nccl-tests defines it, from
// this rank's input bytes, its duration and the group size.
double BusBandwidthGbps(const char* op, std::int64_t input_bytes, double seconds, int ranks);

// `run` (the collective `op` of the group's communication thread) wrapped
// so that the channel records its start, then its end, bytes, duration and
// bus bandwidth; `run` itself when there is no channel. The end is recorded
// when `run` throws too.
std::function<void()> RecordCollective(const OpDesc& op, std::function<void()> run, int ranks);

// The same record for a collective that does not run as one function (the
// caller-run shared-memory path, gloo_backend.cc): the start is recorded by
// Begin, the end (bytes, duration, bus bandwidth) when the last copy of the
// returned pointer goes. Null when there is no channel.
class CollectiveRecord;
std::shared_ptr<CollectiveRecord> BeginCollective(const OpDesc& op, int ranks);

}  // namespace ddp::detail
