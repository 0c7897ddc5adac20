// Replica transfer between two agents on loopback (issue 28's goal: >= 1
// GB/s; docs/benchmarks.md, "Peer replicas"). In one process, over real TCP
// on 127.0.0.1, with the agent's own classes (checkpoint_replicas.h):
//
//   put      ReplicaService::Put of R ranks x N MiB from memory to a
//            receiving service (its memfds, fallocated and mapped)
//   sender   the background sender: from SetRound(successor) until the
//            receiver holds the step, sending each rank's committed slot
//            straight from the checkpoint memory
//   fetch    the restore's path: ReplicaService::Fetch of the held replica
//            straight into a checkpoint memory (CheckpointMemory::BeginSeed),
//            checksummed as it arrives, and committed
//
// Each rank's bytes carry a CRC-32C, as workers with the SDK library
// record them; --crc32 1 gives zlib's CRC-32 instead (Python without it).
// --encrypt 0|1 (default: the job's default, --ckpt_encrypt) sends every
// connection in plaintext or in AES-256-GCM records (docs/security.md);
// encrypted, it first prints the record layer's own speed on one core.
// Then the cost of a connection: the median of H puts of one byte per rank
// (connect, handshake, request, reply), and encrypted, the X25519 exchange's
// own work.
//
// Usage: replica_bench [--mib N (256)] [--ranks R (2)] [--reps K (5)] [--crc32 0|1]
//                      [--encrypt 0|1] [--handshakes H (200)]
// Prints the median of K runs of each in GB/s (10^9 bytes per second).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_replicas.h"
#include "ddprun/agent/replica_cipher.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"

namespace {

using ddprun::agent::CheckpointMemory;
using ddprun::agent::ReplicaService;
using ddprun::agent::replica::Header;
using ddprun::agent::replica::Op;
using ddprun::agent::replica::Seat;
using Clock = std::chrono::steady_clock;

// User and system CPU seconds of this process (all its threads).
double ProcessCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<ReplicaService> Service(std::uint64_t limit, CheckpointMemory* memory,
                                        bool encrypt) {
  ReplicaService::Options o;
  o.job_id = "bench";
  o.host = "127.0.0.1";
  o.limit_bytes = limit;
  o.encrypt = encrypt;
  auto s = std::make_unique<ReplicaService>(
      o, memory, [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); });
  if (!s->Start().ok()) std::exit(1);
  s->SetRound(1, "tok", "");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = 256;
  int ranks = 2, reps = 5, handshakes = 200;
  bool zlib_crc = false;
  bool encrypt = ReplicaService::Options{}.encrypt;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--crc32")) zlib_crc = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--encrypt")) encrypt = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--handshakes")) handshakes = std::atoi(argv[i + 1]);
  }
  const std::uint64_t bytes = mib << 20;
  const double total = static_cast<double>(bytes) * ranks;
  std::vector<std::string> data;
  for (int j = 0; j < ranks; ++j) {
    std::string d(bytes, '\0');
    for (std::uint64_t k = 0; k < bytes; k += 4096) d[k] = static_cast<char>(k >> 12) + j;
    data.push_back(std::move(d));
  }
  CheckpointMemory memory(bytes), restored(bytes);
  if (!memory.Ensure(ranks).ok() || !restored.Ensure(ranks).ok()) return 1;
  auto receiver = Service(bytes, nullptr, encrypt);

  Header h;
  h.op = Op::kPut;
  h.job_id = "bench";
  h.token = "tok";
  h.round = 1;
  h.seat = Seat{0, ranks, ranks};
  for (const std::string& d : data) {
    h.sizes.push_back(d.size());
    const std::uint32_t kind = zlib_crc ? ddprun::checkpoint_layout::kChecksumCrc32
                                        : ddprun::checkpoint_layout::kChecksumCrc32c;
    h.crcs.push_back(ddprun::checkpoint_checksum::SnapshotChecksum(kind, d.data(), d.size()));
    h.kinds.push_back(kind);
  }
  std::vector<std::string_view> views(data.begin(), data.end());
  if (encrypt) {
    // The record layer alone on one core, no sockets: what each end's
    // AES-256-GCM costs.
    namespace rc = ddprun::agent::replica;
    auto a = rc::KeyExchange::Create();
    auto b = rc::KeyExchange::Create();
    if (!a.ok() || !b.ok()) {
      std::fprintf(stderr, "%s\n", std::string(a.status().message()).c_str());
      return 1;
    }
    const rc::Transcript t{"nonce-s", "nonce-c", (*b)->public_key(), (*a)->public_key()};
    const rc::ChannelKeys keys =
        rc::DeriveChannelKeys("tok", "bench", *(*a)->SharedSecret((*b)->public_key()), t);
    auto sealer = rc::RecordSealer::Create(keys.client_to_server);
    auto opener = rc::RecordOpener::Create(keys.client_to_server);
    if (!sealer.ok() || !opener.ok()) {
      std::fprintf(stderr, "%s\n", std::string(sealer.status().message()).c_str());
      return 1;
    }
    std::string record(rc::kRecordHeaderBytes + rc::kMaxRecordBytes + rc::kTagBytes, '\0');
    const std::string& d = data[0];
    double seal_s = 0, open_s = 0;
    for (std::size_t at = 0; at < d.size(); at += rc::kMaxRecordBytes) {
      const std::size_t n = std::min<std::size_t>(rc::kMaxRecordBytes, d.size() - at);
      auto t0 = Clock::now();
      if (!(*sealer)->Seal(d.data() + at, n, record.data()).ok()) return 1;
      auto t1 = Clock::now();
      char* p = record.data() + rc::kRecordHeaderBytes;
      if (!(*opener)->Open(record.data(), p, n, p + n).ok()) return 1;
      seal_s += std::chrono::duration<double>(t1 - t0).count();
      open_s += std::chrono::duration<double>(Clock::now() - t1).count();
    }
    std::printf("record layer, one core, %llu MiB: seal %.2f GB/s, open %.2f GB/s\n",
                static_cast<unsigned long long>(mib), d.size() / seal_s / 1e9,
                d.size() / open_s / 1e9);
  }

  {
    // The handshake, per connection: a put of one byte per rank (connect,
    // handshake, request, reply), `handshakes` times, to a seat of its own;
    // encrypted, first the X25519 work alone (what both ends add: two key
    // pairs and two shared secrets).
    namespace rc = ddprun::agent::replica;
    std::vector<double> x25519_us, put_us;
    for (int i = 0; encrypt && i < handshakes; ++i) {
      const auto t0 = Clock::now();
      auto a = rc::KeyExchange::Create();
      auto b = rc::KeyExchange::Create();
      if (!a.ok() || !b.ok() || !(*a)->SharedSecret((*b)->public_key()).ok() ||
          !(*b)->SharedSecret((*a)->public_key()).ok()) {
        return 1;
      }
      x25519_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    Header small = h;
    small.seat = Seat{ranks, ranks, 2 * ranks};
    small.sizes.assign(static_cast<std::size_t>(ranks), 1);
    small.crcs.clear();
    for (int j = 0; j < ranks; ++j) {
      small.crcs.push_back(ddprun::checkpoint_checksum::SnapshotChecksum(small.kinds[0], "x", 1));
    }
    const std::vector<std::string_view> one(static_cast<std::size_t>(ranks), "x");
    const double cpu0 = ProcessCpuSeconds();
    for (int i = 0; i < handshakes; ++i) {
      small.step = i;
      const auto t0 = Clock::now();
      if (absl::Status st = ReplicaService::Put(receiver->endpoint(), small, one,
                                                Clock::now() + std::chrono::seconds(10), encrypt);
          !st.ok()) {
        std::fprintf(stderr, "put of one byte: %s\n", std::string(st.message()).c_str());
        return 1;
      }
      put_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (handshakes > 0) {
      // Both ends run in this process: its CPU time is theirs together.
      const double cpu_us = (ProcessCpuSeconds() - cpu0) / handshakes * 1e6;
      std::printf(
          "one connection (put of 1 byte x %d ranks), median of %d: %.0f us, CPU of both ends "
          "%.0f us%s\n",
          ranks, handshakes, Median(put_us), cpu_us, encrypt ? "" : " (plaintext)");
    }
    if (!x25519_us.empty()) {
      std::printf("  of which X25519, both ends (2 key pairs, 2 shared secrets): %.0f us\n",
                  Median(x25519_us));
    }
  }

  std::vector<double> put, sender, fetch;
  for (int r = 0; r < reps; ++r) {
    h.step = r;
    auto t0 = Clock::now();
    if (absl::Status st = ReplicaService::Put(receiver->endpoint(), h, views,
                                              Clock::now() + std::chrono::seconds(120), encrypt);
        !st.ok()) {
      std::fprintf(stderr, "put: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    put.push_back(total / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);

    t0 = Clock::now();
    std::vector<CheckpointMemory::SeedSlot> slots;
    auto f = ReplicaService::Fetch(receiver->endpoint(), "bench", "tok", 1, h.seat, bytes,
                                   Clock::now() + std::chrono::seconds(120), encrypt,
                                   [&](int j, std::uint64_t size) -> absl::StatusOr<char*> {
                                     auto slot = restored.BeginSeed(j, size);
                                     if (!slot.ok()) return slot.status();
                                     slots.push_back(*std::move(slot));
                                     return slots.back().data();
                                   });
    for (int j = 0; f.ok() && j < ranks; ++j) {
      const auto i = static_cast<std::size_t>(j);
      if (!slots[i].Commit(f->step, j, ranks, f->crcs[i], f->kinds[i]).ok()) return 1;
    }
    if (!f.ok()) {
      std::fprintf(stderr, "fetch: %s\n", std::string(f.status().message()).c_str());
      return 1;
    }
    fetch.push_back(total / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
    slots.clear();
    for (int j = 0; j < ranks; ++j) {
      const auto c = restored.Committed(j);
      auto got = c.empty() ? absl::StatusOr<std::string>(absl::NotFoundError("none"))
                           : restored.ReadCommitted(j, c[0]);
      if (!got.ok() || *got != data[static_cast<std::size_t>(j)]) {
        std::fprintf(stderr, "fetch: rank %d restored other bytes\n", j);
        return 1;
      }
    }
  }
  // The sender: a fresh step each run, committed into the checkpoint memory.
  auto node = Service(bytes, &memory, encrypt);
  for (int r = 0; r < reps; ++r) {
    const std::int64_t step = 1000 + r;
    for (int j = 0; j < ranks; ++j) {
      if (!memory.Seed(j, step, j, ranks, data[static_cast<std::size_t>(j)]).ok()) return 1;
    }
    const auto t0 = Clock::now();
    node->SetRound(1, "tok", receiver->endpoint());
    while (node->sent_step() != step) std::this_thread::sleep_for(std::chrono::microseconds(200));
    // The poll's wait (at most kPollInterval) is not transfer time: the
    // sender is woken by SetRound; measured from there.
    sender.push_back(total / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
    node->SetRound(1, "tok", "");
  }
  std::printf("replica transfer on loopback, %d ranks x %llu MiB, median of %d, %s:\n", ranks,
              static_cast<unsigned long long>(mib), reps,
              encrypt ? "encrypted (AES-256-GCM)" : "plaintext");
  std::printf("  put     %.2f GB/s  (Put from memory into the receiver's memfds)\n", Median(put));
  std::printf(
      "  sender  %.2f GB/s  (background sender: committed slots sent straight from memory)\n",
      Median(sender));
  std::printf("  fetch   %.2f GB/s  (restore's Fetch into checkpoint memory, %s checked)\n",
              Median(fetch), zlib_crc ? "CRC-32" : "CRC-32C");
  return 0;
}
