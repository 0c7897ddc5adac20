// The agent's checkpoint memory: one sealed memfd per local rank with the
// layout's header, commit records read back as the worker side writes them
// (checkpoint_layout.h), the steps every local rank holds, and the spawn's
// environment and inherited descriptor.
#include "ddprun/agent/checkpoint_memory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>

#include "ddprun/agent/process_launcher.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/common/worker_env_names.h"

namespace ddprun::agent {
namespace {

namespace layout = checkpoint_layout;

// Writes slot `slot`'s record as ddprun.checkpoint.save does.
void WriteRecord(int fd, int slot, std::uint32_t state, std::uint64_t generation, std::int64_t step,
                 int rank, int world_size, std::uint64_t size = 128) {
  unsigned char rec[layout::kSlotRecordBytes] = {};
  std::memcpy(rec + layout::kStateOffset, &state, 4);
  std::memcpy(rec + layout::kGenerationOffset, &generation, 8);
  std::memcpy(rec + layout::kStepOffset, &step, 8);
  std::memcpy(rec + layout::kSizeOffset, &size, 8);
  std::memcpy(rec + layout::kRankOffset, &rank, 4);
  std::memcpy(rec + layout::kWorldSizeOffset, &world_size, 4);
  REQUIRE(::pwrite(fd, rec, sizeof rec, static_cast<off_t>(layout::SlotRecordOffset(slot))) ==
          static_cast<ssize_t>(sizeof rec));
}

TEST_CASE("checkpoint memory: a sealed memfd per local rank with the layout's header", "[unit]") {
  CheckpointMemory mem(100'000);
  REQUIRE(mem.fd(0) == -1);
  REQUIRE(mem.Ensure(2).ok());
  REQUIRE(mem.fd(0) >= 0);
  REQUIRE(mem.fd(1) >= 0);
  REQUIRE(mem.fd(2) == -1);
  CHECK(mem.slot_capacity() == 102'400);  // rounded up to a page

  struct stat st {};
  REQUIRE(::fstat(mem.fd(0), &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_size) == layout::kHeaderBytes + 2 * 102'400);
  char header[32] = {};
  REQUIRE(::pread(mem.fd(0), header, sizeof header, 0) == sizeof header);
  CHECK(std::memcmp(header, layout::kMagic, 8) == 0);
  std::uint64_t capacity = 0, limit = 0;
  std::memcpy(&capacity, header + layout::kCapacityOffset, 8);
  std::memcpy(&limit, header + layout::kLimitOffset, 8);
  CHECK(capacity == 102'400);
  CHECK(limit == 100'000);
  // Sealed: a worker cannot grow it past the limit, nor shrink it under the agent.
  CHECK(::ftruncate(mem.fd(0), st.st_size * 2) != 0);
  CHECK(::ftruncate(mem.fd(0), 4096) != 0);
  // Close-on-exec in the agent: only the spawn's inherit list hands it on.
  CHECK((::fcntl(mem.fd(0), F_GETFD) & FD_CLOEXEC) != 0);
  // Ensure is idempotent: the same memory in the next round.
  const int fd0 = mem.fd(0);
  REQUIRE(mem.Ensure(2).ok());
  CHECK(mem.fd(0) == fd0);
}

TEST_CASE("checkpoint memory: committed snapshots, newest first; a save cut short is left out",
          "[unit]") {
  CheckpointMemory mem(1 << 20);
  REQUIRE(mem.Ensure(1).ok());
  CHECK(mem.Committed(0).empty());
  WriteRecord(mem.fd(0), 0, layout::kSlotCommitted, 7, 70, 3, 4);
  WriteRecord(mem.fd(0), 1, layout::kSlotCommitted, 8, 80, 3, 4);
  auto c = mem.Committed(0);
  REQUIRE(c.size() == 2);
  CHECK(c[0].step == 80);
  CHECK(c[1].step == 70);
  CHECK(c[0].rank == 3);
  CHECK(c[0].world_size == 4);
  // The worker died while writing slot 0 over step 70: only step 80 is left.
  WriteRecord(mem.fd(0), 0, layout::kSlotWriting, 7, 70, 3, 4);
  c = mem.Committed(0);
  REQUIRE(c.size() == 1);
  CHECK(c[0].step == 80);
  // A record claiming more than the limit is not one this layout wrote.
  WriteRecord(mem.fd(0), 1, layout::kSlotCommitted, 9, 90, 3, 4, (1 << 20) + 1);
  CHECK(mem.Committed(0).empty());
}

TEST_CASE(
    "checkpoint memory: a snapshot written in place (the restore's path) commits with the "
    "checksum it was sent with; the replica gate forgets what was acknowledged when the contents "
    "change",
    "[unit]") {
  CheckpointMemory mem(1 << 20);
  REQUIRE(mem.Ensure(1).ok());
  const std::string bytes(300000, 'r');
  auto slot = mem.BeginSeed(0, bytes.size());
  REQUIRE(slot.ok());
  CHECK(mem.Committed(0).empty());  // nothing loadable until the commit
  std::memcpy(slot->data(), bytes.data(), bytes.size());
  REQUIRE(slot->Commit(12, 3, 4, 0xabcd, layout::kChecksumCrc32).ok());
  auto c = mem.Committed(0);
  REQUIRE(c.size() == 1);
  CHECK(c[0].step == 12);
  CHECK(c[0].rank == 3);
  CHECK(c[0].size == bytes.size());
  CHECK(c[0].crc == 0xabcd);
  CHECK(c[0].checksum_kind == layout::kChecksumCrc32);
  CHECK_FALSE(mem.BeginSeed(0, (1 << 20) + 1).ok());  // over --ckpt_shm_limit
  // The gate: open (0), closed with nothing acknowledged (1), acknowledged
  // up to a generation (1 + it); new contents (Clear, Seed) keep it closed
  // but forget the acknowledgement, and one recorded for the old contents'
  // epoch is refused.
  CHECK(mem.ReplicaGate(0) == 0);
  mem.SetReplicaGate(0, true);
  CHECK(mem.ReplicaGate(0) == 1);
  const std::uint64_t epoch = mem.epoch(0);
  CHECK(mem.SetReplicaAcked(0, epoch, 5));
  CHECK(mem.ReplicaGate(0) == 6);
  REQUIRE(mem.Seed(0, 13, 3, 4, "new").ok());
  CHECK(mem.ReplicaGate(0) == 1);
  CHECK_FALSE(mem.SetReplicaAcked(0, epoch, 7));
  CHECK(mem.ReplicaGate(0) == 1);
  mem.SetReplicaGate(0, false);
  mem.Clear(0);
  CHECK(mem.ReplicaGate(0) == 0);
}

TEST_CASE("checkpoint memory: the steps every local rank committed as its rank", "[unit]") {
  CheckpointMemory mem(1 << 20);
  REQUIRE(mem.Ensure(2).ok());
  CHECK(mem.CommonSteps(2, 0, 2).empty());  // a fresh start
  // Rank 0 got one save further than rank 1 before the failure.
  WriteRecord(mem.fd(0), 0, layout::kSlotCommitted, 5, 5, 0, 2);
  WriteRecord(mem.fd(0), 1, layout::kSlotCommitted, 6, 6, 0, 2);
  WriteRecord(mem.fd(1), 0, layout::kSlotCommitted, 5, 5, 1, 2);
  WriteRecord(mem.fd(1), 1, layout::kSlotWriting, 4, 6, 1, 2);
  CHECK(mem.CommonSteps(2, 0, 2) == std::vector<std::int64_t>{5});
  WriteRecord(mem.fd(1), 1, layout::kSlotCommitted, 6, 6, 1, 2);
  CHECK(mem.CommonSteps(2, 0, 2) == std::vector<std::int64_t>{5, 6});
  // The job's shape changed (another base rank or world size): nothing
  // saved under the old one counts, the workers start fresh.
  CHECK(mem.CommonSteps(2, 2, 4).empty());
  CHECK(mem.CommonSteps(2, 0, 3).empty());
}

// --ckpt_replicas 1 (docs/checkpoint.md, "Replica lag"): three slots, the
// count in the header for every reader; a restore seeds a seat's two
// replicas, the older into slot 0, and load's steps include both.
TEST_CASE("checkpoint memory: three slots with replicas, the count in the header", "[unit]") {
  CheckpointMemory plain(100'000);
  REQUIRE(plain.Ensure(1).ok());
  std::uint32_t slots = 0;
  REQUIRE(::pread(plain.fd(0), &slots, 4, layout::kSlotsOffset) == 4);
  CHECK(slots == layout::kSlotsPlain);
  std::uint32_t version = 0;
  REQUIRE(::pread(plain.fd(0), &version, 4, layout::kVersionOffset) == 4);
  CHECK(version == 3);

  CheckpointMemory mem(100'000);
  mem.set_slots(static_cast<int>(layout::kSlotsWithReplicas));
  REQUIRE(mem.Ensure(2).ok());
  struct stat st {};
  REQUIRE(::fstat(mem.fd(1), &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_size) == layout::kHeaderBytes + 3 * 102'400);
  REQUIRE(::pread(mem.fd(1), &slots, 4, layout::kSlotsOffset) == 4);
  CHECK(slots == 3);
  // Three committed saves of each rank, one cut short on rank 1.
  for (int j = 0; j < 2; ++j) {
    WriteRecord(mem.fd(j), 0, layout::kSlotCommitted, 4, 4, j, 2);
    WriteRecord(mem.fd(j), 1, layout::kSlotCommitted, 5, 5, j, 2);
    WriteRecord(mem.fd(j), 2, layout::kSlotCommitted, 6, 6, j, 2);
  }
  auto c = mem.Committed(0);
  REQUIRE(c.size() == 3);
  CHECK(c[0].step == 6);
  CHECK(c[2].step == 4);
  CHECK(c[0].slot == 2);
  CHECK(mem.CommonSteps(2, 0, 2) == std::vector<std::int64_t>{4, 5, 6});
  WriteRecord(mem.fd(1), 2, layout::kSlotWriting, 6, 6, 1, 2);
  CHECK(mem.CommonSteps(2, 0, 2) == std::vector<std::int64_t>{4, 5});
  // A slot's bytes read back from the third slot.
  const std::string bytes(5000, 'z');
  REQUIRE(mem.Seed(0, 9, 0, 2, bytes, 2).ok());
  c = mem.Committed(0);
  auto third = std::find_if(c.begin(), c.end(), [](const auto& s) { return s.slot == 2; });
  REQUIRE(third != c.end());
  CHECK(third->step == 9);
  auto read = mem.ReadCommitted(0, *third);
  REQUIRE(read.ok());
  CHECK(*read == bytes);

  // The restore of two replicas: slot 0 clears every record first, slot 1
  // only its own; generations follow the slots, the newest highest.
  REQUIRE(mem.Seed(0, 7, 0, 2, "older").ok());
  REQUIRE(mem.Seed(0, 8, 0, 2, "newer", 1).ok());
  c = mem.Committed(0);
  REQUIRE(c.size() == 2);
  CHECK(c[0].step == 8);
  CHECK(c[0].generation == 2);
  CHECK(c[1].step == 7);
  CHECK(c[1].generation == 1);
  CHECK_FALSE(mem.Seed(0, 9, 0, 2, "x", 3).ok());  // no slot 3
  // Written in place, slot 0 clears only its own record (a restore clears
  // the memory first and fills the newest slot first).
  auto older = mem.BeginSeed(0, 5, 0);
  REQUIRE(older.ok());
  c = mem.Committed(0);
  REQUIRE(c.size() == 1);
  CHECK(c[0].step == 8);
  std::memcpy(older->data(), "older", 5);
  REQUIRE(older->Commit(6, 0, 2, 0, layout::kChecksumCrc32c).ok());
  c = mem.Committed(0);
  REQUIRE(c.size() == 2);
  CHECK(c[0].step == 8);
  CHECK(c[1].step == 6);
}

TEST_CASE("checkpoint memory: the spawn inherits the descriptor and its variables", "[unit]") {
  CheckpointMemory mem(1 << 20);
  REQUIRE(mem.Ensure(2).ok());
  SpawnSpec spec;
  mem.AddToSpawn(1, {5, 6}, &spec);
  CHECK(spec.env[kEnvCkptFd] == std::to_string(mem.fd(1)));
  CHECK(spec.env[kEnvCkptSteps] == "5,6");
  CHECK(spec.inherit_fds == std::vector<int>{mem.fd(1)});

  SpawnSpec fresh;
  mem.AddToSpawn(0, {}, &fresh);
  CHECK(fresh.env[kEnvCkptSteps].empty());

  // Without checkpoint memory, values inherited from the agent's own
  // environment (an outer job) are dropped.
  SpawnSpec off;
  off.env[kEnvCkptFd] = "9";
  off.env[kEnvCkptSteps] = "1";
  RemoveCheckpointEnv(&off.env);
  CHECK(off.env.count(kEnvCkptFd) == 0);
  CHECK(off.env.count(kEnvCkptSteps) == 0);
}

}  // namespace
}  // namespace ddprun::agent
