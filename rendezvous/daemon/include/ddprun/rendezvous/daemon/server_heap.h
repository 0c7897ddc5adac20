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

// glibc tunables for a serving process: every thread allocates from the one
// brk heap (arena_max=1), and glibc asks for transparent huge pages on each
// extension of it (hugetlb=1). A 16k-node job's first round on a fresh
// daemon touches ~280 MB of new heap: 70k page faults with 4 KiB pages, about
// 1 s of the daemon's CPU on this machine's VM, against a few hundred with
// huge pages (docs/benchmarks.md "Rendezvous, tenth session"). Threads' own
// arenas grow with mprotect in page steps, where huge pages rarely apply.
inline constexpr char kServerHeapTunables[] = "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1";

// glibc reads GLIBC_TUNABLES only when a program starts, so: re-executes this
// program (/proc/self/exe, the same argv and environment) with
// kServerHeapTunables appended to GLIBC_TUNABLES, once. Returns without doing
// so where GLIBC_TUNABLES already names glibc.malloc.hugetlb or
// glibc.malloc.arena_max (the user's choice stands: hugetlb=0 turns this
// off), in the re-executed process (which gets GLIBC_TUNABLES back as the
// user had it, so nothing it starts inherits ours), where the program has no
// interpreter (started as `ld.so PROGRAM`, or static), and where the exec
// fails (glibc's defaults then). Call before any thread starts; the pid stays.
void ExecWithServerHeap(char** argv);

// Set in the re-executed process's environment at its start (and removed from
// it once read): "-" where GLIBC_TUNABLES was unset, "=" and its value else.
inline constexpr char kServerHeapReexecMark[] = "DDPRUN_SERVER_HEAP_REEXEC";

}  // namespace ddprun::rendezvous
