#include "minimind/util/matmul_peak.h"

#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <sstream>

#include "minimind/util/blas_check.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

std::string CpuFeatures::flags() const {
  std::string out;
  for (const auto& [on, name] :
       {std::pair{avx2, "avx2"}, std::pair{avx512f, "avx512f"},
        std::pair{avx512_bf16, "avx512_bf16"}, std::pair{amx_bf16, "amx_bf16"}})
    if (on) out += (out.empty() ? "" : " ") + std::string(name);
  return out.empty() ? "none of avx2, avx512f, avx512_bf16, amx_bf16" : out;
}

CpuFeatures parse_cpu_features(const std::string& cpuinfo) {
  CpuFeatures f;
  std::istringstream in(cpuinfo);
  bool have_flags = false;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && f.model.empty()) f.model = value;
    if (key == "flags" && !have_flags) {
      have_flags = true;
      std::istringstream words(value);
      for (std::string w; words >> w;) {
        f.avx2 |= w == "avx2";
        f.avx512f |= w == "avx512f";
        f.avx512_bf16 |= w == "avx512_bf16";
        f.amx_bf16 |= w == "amx_bf16";
      }
    }
  }
  return f;
}

CpuFeatures cpu_features() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return parse_cpu_features(text.str());
}

void onednn_sgemm(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  const dnnl_status_t status = dnnl_sgemm('N', 'N', M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
  TORCH_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status));
}

double best_seconds(const std::function<void()>& work, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const Stopwatch clock;
    work();
    best = std::min(best, clock.seconds());
  }
  return best;
}

double product_gflops(const std::function<void()>& product, int64_t M, int64_t N, int64_t K,
                      int reps) {
  product();
  const double best = best_seconds(product, reps);
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / best /
         1e9;
}

namespace {

// torch's intra-op threads (oneDNN's OpenMP pool is the same) at one while it lives.
class OneTorchThread {
 public:
  OneTorchThread() : before_(torch::get_num_threads()) { torch::set_num_threads(1); }
  ~OneTorchThread() { torch::set_num_threads(before_); }
  OneTorchThread(const OneTorchThread&) = delete;
  OneTorchThread& operator=(const OneTorchThread&) = delete;

 private:
  int before_;
};

// oneDNN's matmul with bf16 inputs and fp32 output for [n, n] operands, or nothing where
// oneDNN has no such kernel: oneDNN 2.6 runs bf16 products on AVX-512 CPUs only (emulated
// there without bf16 instructions); on an AVX2 CPU the primitive cannot be made.
std::optional<dnnl::matmul::primitive_desc> bf16_matmul(int64_t n, const dnnl::engine& engine) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a_md({n, n}, dt::bf16, tag::ab), b_md({n, n}, dt::bf16, tag::ab),
      c_md({n, n}, dt::f32, tag::ab);
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<MatmulPeak> measure_matmul_peaks() {
  const OneTorchThread one_torch;
  const OneBlasThread one_blas;
  torch::NoGradGuard no_grad;
  MatmulPeak blas{"openblas", "fp32", blas_core_name(), 0};
  if (blas.kernel.empty()) blas.backend = "blas", blas.kernel = loaded_blas_library();
  MatmulPeak sgemm{"onednn", "fp32", "dnnl_sgemm", 0};
  MatmulPeak bf16{"onednn", "bf16", "", 0};
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  bool has_bf16 = true;
  for (const int64_t n : {512, 1024, 1536}) {
    torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
    blas.gflops = std::max(blas.gflops, product_gflops([&] { torch::mm_out(c, a, b); }, n, n, n));
    sgemm.gflops =
        std::max(sgemm.gflops, product_gflops(
                                   [&] {
                                     onednn_sgemm(n, n, n, a.data_ptr<float>(), b.data_ptr<float>(),
                                                  c.data_ptr<float>());
                                   },
                                   n, n, n));
    // bf16 inputs, fp32 output: the product mixed precision runs.
    const std::optional<dnnl::matmul::primitive_desc> pd = bf16_matmul(n, engine);
    if (!pd) {
      has_bf16 = false;
      continue;
    }
    bf16.kernel = pd->impl_info_str();
    torch::Tensor a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    dnnl::memory am(pd->src_desc(), engine, a16.data_ptr()),
        bm(pd->weights_desc(), engine, b16.data_ptr()), cm(pd->dst_desc(), engine, c.data_ptr());
    const dnnl::matmul matmul(*pd);
    bf16.gflops = std::max(bf16.gflops, product_gflops(
                                            [&] {
                                              matmul.execute(stream, {{DNNL_ARG_SRC, am},
                                                                      {DNNL_ARG_WEIGHTS, bm},
                                                                      {DNNL_ARG_DST, cm}});
                                              stream.wait();
                                            },
                                            n, n, n));
  }
  if (!has_bf16) return {blas, sgemm};
  return {blas, sgemm, bf16};
}

const MatmulPeak* best_peak(const std::vector<MatmulPeak>& peaks, const std::string& precision) {
  const MatmulPeak* best = nullptr;
  for (const auto& p : peaks)
    if (p.precision == precision && (!best || p.gflops > best->gflops)) best = &p;
  return best;
}

}  // namespace minimind
