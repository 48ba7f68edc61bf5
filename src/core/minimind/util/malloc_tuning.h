// glibc malloc settings for a training process.
#pragma once

namespace minimind {

// By default glibc serves every block above 128 KiB-32 MiB with a fresh mmap and returns it
// to the kernel on free, so each training step faults in (and zero-fills) hundreds of MB of
// activations, logits and gradients anew: perf showed ~10 % of the step in page-fault and
// clear_page kernel code. Freed blocks are kept in the heap for reuse instead
// (docs/performance.md, "Memory allocator"). One arena for every
// thread, so helper threads reuse that heap too. Call once, first thing in main. Returns
// false if glibc refused a setting.
bool tune_malloc();

}  // namespace minimind
