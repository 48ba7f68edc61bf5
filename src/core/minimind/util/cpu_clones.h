// The hand-written loops (fused AdamW, RMSNorm and SwiGLU backwards) are compiled three times
// by GCC, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline, and the CPU picks at
// load time (target_clones); AVX-512 ran the bf16 experts' SwiGLU forward 1.3x faster than
// AVX2 (0.8 against 1.0 ns per element). They must round alike on every machine, so GCC may
// not contract a product and a sum into a fused multiply-add there: the files wrap the loops in
//   MINIMIND_NO_FMA_BEGIN ... MINIMIND_NO_FMA_END.
// Clang (the fuzz and sanitizer builds) gets the baseline only, which has no FMA.
// A loop with a floating-point comparison (a clamp) vectorises only if GCC may assume that no
// floating-point operation traps: MINIMIND_NO_TRAPS_BEGIN ... END around it (the same
// values; only the order of floating-point exception flags, which nothing here reads).
// MINIMIND_INDEPENDENT_ITERATIONS before a loop: its iterations do not depend on each other
// (an output that may be its input, each element read before it is written), in each
// compiler's own words.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define MINIMIND_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define MINIMIND_NO_FMA_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define MINIMIND_NO_FMA_END _Pragma("GCC pop_options")
#define MINIMIND_NO_TRAPS_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC optimize(\"no-trapping-math\")")
#define MINIMIND_NO_TRAPS_END _Pragma("GCC pop_options")
#define MINIMIND_INDEPENDENT_ITERATIONS _Pragma("GCC ivdep")
#else
#define MINIMIND_CPU_CLONES
#define MINIMIND_NO_FMA_BEGIN
#define MINIMIND_NO_FMA_END
#define MINIMIND_NO_TRAPS_BEGIN
#define MINIMIND_NO_TRAPS_END
#if defined(__clang__)
#define MINIMIND_INDEPENDENT_ITERATIONS _Pragma("clang loop vectorize(assume_safety)")
#else
#define MINIMIND_INDEPENDENT_ITERATIONS
#endif
#endif
