// The process's metrics channel (ddp/metrics.h), for the SDK's own
// recording of collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ddprun/rendezvous/metrics_channel.h"

namespace ddp::detail {

// The channel named by DDPRUN_METRICS_FILE, opened once per process; null
// when there is none.
ddprun::rendezvous::ChannelWriter* MetricsChannel();

// Bus bandwidth in GB/s of one collective, as nccl-tests defines it, from
// this rank's input bytes, its duration and the group size.
double BusBandwidthGbps(const char* op, std::int64_t input_bytes, double seconds, int ranks);

// `run` (a collective of the group's communication thread, described by
// DescribeOp's "op(count x dtype, ...)") wrapped so that the channel records
// its start, then its end, bytes, duration and bus bandwidth; `run` itself
// when there is no channel. The end is recorded when `run` throws too.
std::function<void()> RecordCollective(const std::string& desc, std::function<void()> run,
                                       int ranks);

}  // namespace ddp::detail
