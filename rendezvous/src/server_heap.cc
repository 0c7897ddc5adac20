#include "ddprun/rendezvous/server_heap.h"

#include <malloc.h>

namespace ddprun::rendezvous {

void KeepFreedHeapForReuse() {
  // Each call fails only for an out-of-range value; these are in range.
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapKeepBytes));
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapFromBytes));
  // Grow the heap in steps of 16 MiB (reserved, not touched: no RSS).
  mallopt(M_TOP_PAD, 16 << 20);
}

}  // namespace ddprun::rendezvous
