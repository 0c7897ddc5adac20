// How a rendezvous server process uses glibc's heap. Call once, at the start
// of a process whose main job is serving (ddprund, the rendezvous bench),
// before its threads start: it sets process-wide malloc parameters.
#pragma once

namespace ddprun::rendezvous {

// Keeps memory that a round freed for the next round instead of handing it
// back to the kernel and faulting it in again: glibc trims the heap's free
// top above 128 KiB and serves blocks over 128 KiB with mmap/munmap, so a
// round of 16k agents re-faulted most of its memory every time (page faults
// were ~15 % of the round's CPU samples on this machine's VM). Memory above
// kHeapKeepBytes free at the top is still returned; blocks of kMmapFromBytes
// and more still come from mmap. The cost: the daemon's RSS stays near its
// peak until then (docs/benchmarks.md "Daemon memory").
inline constexpr long kHeapKeepBytes = 256L << 20;
inline constexpr long kMmapFromBytes = 32L << 20;
void KeepFreedHeapForReuse();

}  // namespace ddprun::rendezvous
