#include "ddprun/rendezvous/daemon/server_heap.h"

#include <malloc.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace ddprun::rendezvous {

void KeepFreedHeapForReuse() {
  // Each call fails only for an out-of-range value; these are in range.
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapKeepBytes));
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapFromBytes));
  // Grow the heap in steps of 16 MiB (reserved, not touched: no RSS).
  mallopt(M_TOP_PAD, 16 << 20);
}

namespace {

// Restores GLIBC_TUNABLES as `mark` records it and removes the mark.
void RestoreTunables(const std::string& mark) {
  if (mark.rfind('=', 0) == 0) {
    setenv("GLIBC_TUNABLES", mark.c_str() + 1, 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
  unsetenv(kServerHeapReexecMark);
}

}  // namespace

void ExecWithServerHeap(char** argv) {
  if (const char* mark = std::getenv(kServerHeapReexecMark)) {
    RestoreTunables(mark);
    return;
  }
  // No interpreter: the program was started through the dynamic loader
  // (`ld-linux-x86-64.so.2 ddprund ...`, where /proc/self/exe is the loader,
  // which would take ddprund's flags for its own) or is linked statically.
  if (getauxval(AT_BASE) == 0) return;
  const char* user = std::getenv("GLIBC_TUNABLES");
  if (user &&
      (std::strstr(user, "glibc.malloc.hugetlb") || std::strstr(user, "glibc.malloc.arena_max"))) {
    return;
  }
  const std::string mark = user ? std::string("=") + user : std::string("-");
  const std::string tunables =
      user && *user ? std::string(user) + ":" + kServerHeapTunables : kServerHeapTunables;
  setenv(kServerHeapReexecMark, mark.c_str(), 1);
  setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  execv("/proc/self/exe", argv);
  RestoreTunables(mark);  // no /proc: glibc's defaults
}

}  // namespace ddprun::rendezvous
