#pragma once

// TCP_USER_TIMEOUT on a gRPC channel's connections, apart from its keepalive
// timeout.
//
// gRPC sets a client connection's TCP_USER_TIMEOUT to its keepalive timeout,
// which ties two questions together: "is the link or the host gone?" (the
// peer's kernel no longer acknowledges what we send) and "is the peer process
// slow?" (its kernel acknowledged our keepalive ping, but the process has not
// answered it yet). A channel that wants to notice a lost host within a second
// but give a busy server longer for the ping's answer (client.cc,
// kPatientKeepalive) sets the first here and the second as its keepalive
// timeout.

#include <grpcpp/support/channel_arguments.h>

namespace ddprun::rendezvous {

// Makes every client connection of a channel built from `args` abort when
// what it sent stays unacknowledged by the peer's kernel for `timeout_ms`
// (Linux's TCP_USER_TIMEOUT: the connection fails with ETIMEDOUT, which gRPC
// reports like a closed connection). Replaces gRPC's own value, set from
// GRPC_ARG_KEEPALIVE_TIMEOUT_MS; `args` owns what this adds.
void SetTcpUserTimeout(grpc::ChannelArguments& args, int timeout_ms);

}  // namespace ddprun::rendezvous
