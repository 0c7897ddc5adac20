// A load generator for a TCPStore server: N simulated PyTorch workers speaking
// torch 1.13's wire protocol (c10d_wire.h, legacy dialect) from ONE epoll loop
// on the calling thread, each doing what init_process_group does:
//   1. check in:  ADD <prefix>init 1                       (reply: the count)
//   2. unique id: rank 0 SETs <prefix>uid; every other rank WAITs for it and
//                 GETs it (torch's client GET is WAIT then GET)
//   3. barrier:   ADD <prefix>barrier 1; the rank whose ADD returns N SETs
//                 <prefix>barrier_done; every rank WAITs for it.
// A client is one connection (the one that carries the traffic above); with
// conns_per_client = 2 each client also holds the silent second connection a
// torch 1.13 worker opens (its watch-key callback socket).
//
// Bad clients, opened before the job and kept open until it ends:
//   silent:      connect and send nothing
//   half:        send the first half of a SET request, never the rest
//   disconnect:  WAIT for <prefix>barrier_done, then close once half of the
//                good clients have checked in (mid-wait)
// The server must serve the good clients as if the bad ones were not there.
//
// Used by bench/store_bootstrap_bench.cc (timings) and by the integration
// tests (correctness at scale). Linux only (epoll).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ddprun::bench {

struct BootstrapOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int clients = 1000;
  int conns_per_client = 1;
  // At most this many clients between connect() and their first reply, so the
  // listen backlog (SOMAXCONN) never overflows into SYN retransmits.
  int max_connecting = 1024;
  std::string key_prefix = "bootstrap/";
  std::string uid_value = "unique-id-of-the-backend";
  double timeout_s = 120;
  int silent_clients = 0;
  int half_request_clients = 0;
  int disconnect_clients = 0;
};

struct BootstrapResult {
  double seconds = 0;              // first connect() to the last client past the barrier
  double generator_cpu_s = 0;      // CPU time of the generator's thread over that span
  int clients_done = 0;            // clients that got through the barrier
  int wrong_uid = 0;               // clients whose GET returned another value
  bool checkin_counts_ok = false;  // the N check-in ADDs returned 1..N, each once
};

// Runs one bootstrap; an error names what went wrong (connect failed, the
// server closed a good client, the timeout passed with k of N done).
absl::StatusOr<BootstrapResult> RunBootstrap(const BootstrapOptions& opts);

}  // namespace ddprun::bench
