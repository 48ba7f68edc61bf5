#include "minimind/util/malloc_tuning.h"

#include <malloc.h>

namespace minimind {

bool tune_malloc() {
  // Blocks below 1 GiB come from the heap (a fixed threshold also turns off glibc's own
  // adjustment, which stops at 32 MiB, less than one 8x256x6400 fp32 logits tensor).
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  // Free memory at the top of the heap is kept up to 1 GiB instead of trimmed at 128 KiB.
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // Every thread allocates from that one heap: another thread's arena is a 64 MiB heap
  // that mmaps what does not fit and unmaps it on free, so a shard of a micro-batch
  // trained on a helper thread (side_by_side.h) faulted its activations in anew each step
  // (bench config, dense: 2,763 tok/s in two shards against 3,895 in one; one arena
  // 4,121 against 3,276). The threads allocate a few hundred large blocks per step: the
  // arena's lock costs nothing measurable.
  const bool arena_ok = mallopt(M_ARENA_MAX, 1) == 1;
  return mmap_ok && trim_ok && arena_ok;
}

}  // namespace minimind
