// Is torch's matmul running on an optimised BLAS? Debian's default libblas.so.3 is the
// reference BLAS (~4 GFLOP/s fp32 here, 20-30x slower than OpenBLAS).
#pragma once

#include <string>

namespace minimind {

struct BlasReport {
  std::string library;  // resolved path of the loaded libblas.so.3
  double gflops;        // fp32 matmul speed measured now
  bool ok;              // fast enough for training
};

// Measures a few square fp32 matmuls (about 30 ms with OpenBLAS) and names the BLAS.
BlasReport check_blas(int64_t n = 384);

// The real file behind the libblas.so.3 mapped into this process ("" if none).
std::string loaded_blas_library();

// Sets OpenBLAS's own thread count (no-op for another BLAS); returns false if the loaded
// BLAS has no such control. With torch's OpenMP threads already using every core,
// OpenBLAS's extra pthreads only compete with them: on this 2-core machine one BLAS thread
// made training ~30% faster and stable (README, "BLAS and threads").
bool set_blas_threads(int n);

// The thread policy of every command: `requested` torch (OpenMP) threads, 0 = one per
// core; with more than one, OpenBLAS gets one thread (see set_blas_threads). Returns the
// number of torch threads set.
int use_threads(int64_t requested);

// Below this, a matmul-bound trainer is unusable; OpenBLAS gives 90-140 GFLOP/s here.
constexpr double kMinSaneGflops = 20.0;

}  // namespace minimind
