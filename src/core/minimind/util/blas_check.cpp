#include "minimind/util/blas_check.h"

#include <dlfcn.h>
#include <link.h>
#include <torch/torch.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "minimind/util/stopwatch.h"

namespace minimind {

std::string loaded_blas_library() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name;
        if (name && std::strstr(name, "libblas.so")) {
          char resolved[PATH_MAX];
          *static_cast<std::string*>(data) = realpath(name, resolved) ? resolved : name;
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

std::string blas_core_name() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn ? fn() : "";
}

namespace {

// OpenBLAS's kernel sets older than AVX (what 0.3.21 picks for a CPU it does not know).
bool pre_avx_kernels(const std::string& core) {
  for (const char* name : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                           "Coppermine", "Northwood", "Banias"})
    if (core == name) return true;
  return false;
}

constexpr const char* kChangedVar = "MINIMIND_BLAS_KERNELS_CHANGED";

}  // namespace

void use_kernels_fitting_the_cpu(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice, or ours after the exec
  const std::string core = blas_core_name();
  if (!pre_avx_kernels(core)) return;
  const char* better = nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    better = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    better = "Haswell";
  if (!better) return;
  setenv("OPENBLAS_CORETYPE", better, 1);
  setenv(kChangedVar, (core + " -> " + better).c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the kernels we have
  unsetenv(kChangedVar);
}

std::string blas_kernels_changed() {
  const char* changed = std::getenv(kChangedVar);
  return changed ? changed : "";
}

int blas_threads() {
  using GetThreads = int (*)();
  // Looked up once: every matrix product asks (util/matmul.cpp), and dlsym is a hash search.
  static const auto fn =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn ? fn() : 0;
}

bool set_blas_threads(int n) {
  using SetThreads = void (*)(int);
  static const auto fn =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!fn) return false;
  fn(n);
  return true;
}

BlasReport check_blas(int64_t n) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::Tensor c = torch::mm(a, b);  // warm-up: thread pools, page faults
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const Stopwatch clock;
    torch::mm_out(c, a, b);
    best = std::min(best, clock.seconds());
  }
  const double gflops = 2.0 * n * n * n / best / 1e9;
  return {loaded_blas_library(), gflops, gflops >= kMinSaneGflops};
}

}  // namespace minimind
