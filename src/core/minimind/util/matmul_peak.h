// What the machine's matrix products reach, per backend and precision, and the CPU
// features that decide it: the peak minimind-bench divides its MFU by.
//
// Backends: OpenBLAS with the kernel set this process loaded (OPENBLAS_CORETYPE is
// respected, never changed), oneDNN's fp32 GEMM (dnnl_sgemm), and oneDNN's matmul with bf16
// inputs and fp32 output (what mixed precision runs; without bf16 instructions oneDNN
// emulates it, slowly). oneDNN is Debian's libdnnl, the library libtorch_cpu already loads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace minimind {

struct CpuFeatures {
  std::string model;  // "AMD EPYC", "Intel(R) Xeon(R) ..."
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  // The instructions that make bf16 products fast: AVX512_BF16 or AMX.
  bool bf16() const { return avx512_bf16 || amx_bf16; }
  std::string flags() const;  // "avx2 avx512f avx512_bf16" (those present)
};

// From the text of /proc/cpuinfo (the first processor's "model name" and "flags").
CpuFeatures parse_cpu_features(const std::string& cpuinfo);
// This machine's (all false when /proc/cpuinfo cannot be read).
CpuFeatures cpu_features();

struct MatmulPeak {
  std::string backend;    // "openblas", "onednn"
  std::string precision;  // "fp32" | "bf16" (bf16 inputs, fp32 accumulation and output)
  std::string kernel;     // what the backend ran: OpenBLAS's core, oneDNN's implementation
  double gflops = 0;      // one core, the best of the probed shapes
};

// Each backend and precision on one core (OpenBLAS at one thread, oneDNN at one thread),
// best of square products of side 512, 1024 and 1536, each timed as the best of a few.
// About a second. OpenBLAS's and oneDNN's fp32 first, then oneDNN's bf16 where oneDNN has a
// bf16 matmul for this CPU (not on a CPU without AVX-512).
std::vector<MatmulPeak> measure_matmul_peaks();

// The shortest of `reps` runs of `work`, in seconds (no warm-up of its own).
double best_seconds(const std::function<void()>& work, int reps);

// GFLOP/s of an [M, K] x [K, N] product: the best of `reps` runs after one warm-up.
double product_gflops(const std::function<void()>& product, int64_t M, int64_t N, int64_t K,
                      int reps = 3);

// The best entry of `precision` ("" if none).
const MatmulPeak* best_peak(const std::vector<MatmulPeak>& peaks, const std::string& precision);

// C [M, N] = A [M, K] · B [K, N], row-major fp32, through oneDNN (exposed for the test
// that checks the call against torch).
void onednn_sgemm(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C);

}  // namespace minimind
