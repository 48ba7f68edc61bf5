#include "minimind/util/malloc_tuning.h"

#include <malloc.h>

namespace minimind {

bool tune_malloc() {
  // Blocks below 1 GiB come from the heap (a fixed threshold also turns off glibc's own
  // adjustment, which stops at 32 MiB, less than one 8x256x6400 fp32 logits tensor).
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  // Free memory at the top of the heap is kept up to 1 GiB instead of trimmed at 128 KiB.
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace minimind
