// ddp::checkpoint::Save over a memory of three slots (--ckpt_replicas 1;
// docs/checkpoint.md, "Replica lag"), in process, no sockets: each save
// writes the oldest slot (a cut-short one first, never the newest
// committed), reads the slot count from the header, and waits only for the
// replica of the snapshot committed before it (the agent's gate word, which
// the test writes as the agent would). The SDK maps its memory once per
// process, so this program has one case that touches it.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddp/checkpoint.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"

namespace {

namespace layout = ddprun::checkpoint_layout;

struct Rec {
  std::uint32_t state;
  std::uint64_t generation;
  std::int64_t step;
};

TEST_CASE(
    "checkpoint save: three slots, the oldest written, and the wait is for the previous "
    "snapshot's replica only",
    "[unit][checkpoint]") {
  constexpr std::uint64_t kCapacity = 64 * 1024;
  const int fd = ::memfd_create("ddprun-ckpt-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  const std::uint64_t size = layout::kHeaderBytes + layout::kSlotsWithReplicas * kCapacity;
  REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
  auto* base =
      static_cast<unsigned char*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(base != MAP_FAILED);
  std::memcpy(base + layout::kMagicOffset, layout::kMagic, sizeof layout::kMagic);
  std::memcpy(base + layout::kVersionOffset, &layout::kVersion, 4);
  std::memcpy(base + layout::kSlotsOffset, &layout::kSlotsWithReplicas, 4);
  std::memcpy(base + layout::kCapacityOffset, &kCapacity, 8);
  std::memcpy(base + layout::kLimitOffset, &kCapacity, 8);
  auto gate = [&](std::uint64_t v) {
    std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(base + layout::kReplicaGateOffset))
        .store(v, std::memory_order_release);
  };
  auto rec = [&](int slot) {
    const unsigned char* r = base + layout::SlotRecordOffset(slot);
    Rec out{};
    std::memcpy(&out.state, r + layout::kStateOffset, 4);
    std::memcpy(&out.generation, r + layout::kGenerationOffset, 8);
    std::memcpy(&out.step, r + layout::kStepOffset, 8);
    return out;
  };
  ::setenv("DDPRUN_CKPT_FD", std::to_string(fd).c_str(), 1);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::unsetenv("DDPRUN_CKPT_EVERY");
  ::unsetenv("DDPRUN_JOB_ID");
  // A save that waited for its own step's replica would sit here for 30 s
  // and say so: each save below must return well before.
  ::setenv(layout::kEnvReplicaWait, "30", 1);
  std::vector<float> w(1000, 1.0f);
  using Clock = std::chrono::steady_clock;
  auto save = [&](std::int64_t step) {
    w[0] = static_cast<float>(step);
    const auto t0 = Clock::now();
    ddp::checkpoint::Save(step, {{"w", w.data(), w.size() * sizeof(float)}});
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };

  gate(1);  // a successor, nothing acknowledged yet
  // The first save has no previous snapshot: it waits for nothing.
  CHECK(save(10) < 10);
  CHECK(rec(0).state == layout::kSlotCommitted);
  CHECK(rec(0).generation == 1);
  // Generation 1's replica acknowledged; step 11's (generation 2) is not:
  // the save returns (the rule of version 2 waited for generation 2 here).
  gate(1 + 1);
  CHECK(save(11) < 10);
  CHECK(rec(1).generation == 2);
  gate(1 + 2);
  CHECK(save(12) < 10);
  CHECK(rec(2).generation == 3);
  CHECK(rec(2).step == 12);
  // All three committed: the oldest (slot 0, generation 1) is written.
  gate(1 + 3);
  CHECK(save(13) < 10);
  CHECK(rec(0).generation == 4);
  CHECK(rec(0).step == 13);
  CHECK(rec(1).step == 11);
  CHECK(rec(2).step == 12);
  // A save cut short in slot 2 (left "writing"): that slot is written
  // next, though slot 1 holds an older committed snapshot.
  std::atomic_ref<std::uint32_t>(
      *reinterpret_cast<std::uint32_t*>(base + layout::SlotRecordOffset(2)))
      .store(layout::kSlotWriting);
  gate(1 + 4);
  CHECK(save(14) < 10);
  CHECK(rec(2).state == layout::kSlotCommitted);
  CHECK(rec(2).generation == 5);
  CHECK(rec(1).step == 11);
  // Generation 5 (step 14) not acknowledged: the save of step 15 waits
  // until it is, however long; the agent's ack below is what ends it.
  std::atomic<bool> acked{false};
  std::thread agent([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    acked = true;
    gate(1 + 5);
  });
  save(15);
  CHECK(acked.load());
  agent.join();
  CHECK(rec(1).step == 15);  // the oldest then: generation 2
  // An open gate (no successor) never holds a save.
  gate(0);
  CHECK(save(16) < 10);
  CHECK(rec(0).step == 16);
  // Load finds the newest common step in any of the three slots.
  ::setenv("DDPRUN_CKPT_STEPS", "14,15,16", 1);
  auto snap = ddp::checkpoint::Load();
  REQUIRE(snap.has_value());
  CHECK(snap->step == 16);
  float first = 0;
  std::memcpy(&first, snap->Get("w").data(), sizeof first);
  CHECK(first == 16.0f);
  ::unsetenv("DDPRUN_CKPT_STEPS");
  ::unsetenv("DDPRUN_CKPT_FD");
  ::unsetenv(layout::kEnvReplicaWait);
}

}  // namespace
