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

// The CPU kernel set OpenBLAS chose for this machine ("Haswell", "SkylakeX", ...; "" for
// another BLAS). Different kernels sum in different orders: results agree to rounding only.
std::string blas_core_name();

// OpenBLAS 0.3.21 (Debian 12) does not know newer CPUs (Sapphire Rapids: family 6 model
// 143) and falls back to its Prescott kernels (SSE3): fp32 GEMMs ran at ~30 GFLOP/s per core
// on such a machine here, ~208 with its SkylakeX (AVX-512) kernels. The core type is chosen
// when the library loads, so the only way to change it is the OPENBLAS_CORETYPE variable
// before the process starts: when OpenBLAS chose a pre-AVX kernel set on a CPU with AVX2
// (AVX-512), this sets OPENBLAS_CORETYPE=Haswell (SkylakeX) and re-executes the program
// with the same arguments. A variable set by the user is kept. Call first thing in main.
void use_kernels_fitting_the_cpu(char** argv);

// After use_kernels_fitting_the_cpu re-executed the program: what it changed ("Prescott ->
// SkylakeX"), for the log; "" otherwise.
std::string blas_kernels_changed();

// OpenBLAS's own thread count now (0 for another BLAS).
int blas_threads();

// Sets OpenBLAS's own thread count (no-op for another BLAS); returns false if the loaded
// BLAS has no such control.
bool set_blas_threads(int n);

// OpenBLAS at one thread while this object lives, its count before restored after (also
// when an exception leaves the scope). Nothing happens when it already had one thread or
// is not the BLAS.
class OneBlasThread {
 public:
  OneBlasThread() : before_(blas_threads()) {
    if (before_ > 1) set_blas_threads(1);
  }
  ~OneBlasThread() {
    if (before_ > 1) set_blas_threads(before_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int before_;
};

// Below this, a matmul-bound trainer is unusable (the reference BLAS gives a few GFLOP/s).
constexpr double kMinSaneGflops = 20.0;

}  // namespace minimind
