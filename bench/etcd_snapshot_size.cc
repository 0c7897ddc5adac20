// How large a job's snapshot is in etcd (docs/ha.md, docs/benchmarks.md
// "Job snapshots in etcd"): a job table with N members (agents as ddprun's
// agent joins them: a host address, a pid, 8 workers, the training command)
// forms one round; the snapshot it persists is serialized as the etcd journal
// does, then compressed and cut as the journal does. Prints, per N, the
// serialized and compressed bytes per member, the chunks (etcd requests) at
// etcd's default --max-request-bytes, and the compression time; then the N
// at which one uncompressed value would pass etcd's limit. No etcd, no
// sockets: sizes only.
//
//   etcd_snapshot_size [N ...]        default 1024 4096 8192 16384
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/rendezvous/ha/etcd_client.h"
#include "ddprun/rendezvous/ha/etcd_snapshot_chunks.h"
#include "ddprun/rendezvous/ha/job_snapshot_proto.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/v1/state.pb.h"
#include "support/formed_snapshot.h"

namespace rdzv = ddprun::rendezvous;

namespace {

std::string SerializedSnapshot(int n) {
  std::vector<rdzv::JoinSpec> specs;
  for (int i = 0; i < n; ++i) {
    rdzv::JoinSpec s;
    s.job_id = "llama-pretrain-2026-11";
    s.host = "10." + std::to_string(i / 65536) + "." + std::to_string((i / 256) % 256) + "." +
             std::to_string(i % 256);
    s.pid = 100000 + (i * 7919) % 900000;
    s.nproc = 8;
    s.min_nodes = n;
    s.max_nodes = n;
    s.policy.max_restarts = 3;
    s.master_port = 29500;
    s.policy.join_timeout_s = 600;
    s.command = "python3 train.py --config configs/llama.yaml";
    specs.push_back(std::move(s));
  }
  absl::StatusOr<rdzv::JobSnapshot> snap = ddprun::testing::FormedSnapshot(specs);
  if (!snap.ok()) {
    std::fprintf(stderr, "etcd_snapshot_size: %s\n", std::string(snap.status().message()).c_str());
    std::exit(1);
  }
  rdzv::pb::JobSnapshot p;
  rdzv::SnapshotToProto(*snap, &p);
  return p.SerializeAsString();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {1024, 4096, 8192, 16384};
  const double limit = static_cast<double>(rdzv::kEtcdDefaultMaxRequestBytes);
  // The journal's room per chunk at the default limit, rounded down (keys and framing).
  const std::size_t chunk = rdzv::kEtcdDefaultMaxRequestBytes - 2048;
  std::printf("%8s %12s %10s %12s %10s %7s %9s\n", "members", "raw bytes", "raw/member",
              "zlib bytes", "zlib/memb", "chunks", "zlib ms");
  double per_member = 0;
  for (int n : sizes) {
    const std::string raw = SerializedSnapshot(n);
    const auto t0 = std::chrono::steady_clock::now();
    rdzv::SnapshotHead head;
    const std::vector<std::string> chunks = rdzv::CompressAndSplit(raw, chunk, &head);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    per_member = static_cast<double>(raw.size()) / n;
    std::printf("%8d %12zu %10.1f %12llu %10.1f %7zu %9.2f\n", n, raw.size(), per_member,
                static_cast<unsigned long long>(head.compressed_bytes),
                static_cast<double>(head.compressed_bytes) / n, chunks.size(), ms);
  }
  std::printf("one uncompressed value passes etcd's default %.0f bytes at about %.0f members\n",
              limit, limit / per_member);
  return 0;
}
