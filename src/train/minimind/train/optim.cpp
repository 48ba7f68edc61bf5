#include "minimind/train/optim.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"

namespace minimind {

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params,
                                                    const TrainConfig& cfg) {
  auto options = torch::optim::AdamWOptions(cfg.learning_rate)
                     .betas({cfg.beta1, cfg.beta2})
                     .eps(cfg.eps)
                     .weight_decay(cfg.weight_decay);
  return std::make_unique<FusedAdamW>(params, options);
}

namespace {

// One AdamW update of n floats, in torch's order of operations and float roundings, on the
// gradient g = g * g_scale (clipping's product; exact for 1):
// p *= decay; m = m * b1 + (1 - b1) * g; v = v * b2 + (1 - b2) * g * g;
// p += -step_size * m / (sqrt(v) / sqrt(bc2) + eps). Contraction into fused multiply-adds
// is off so every machine rounds the same. The loop vectorises (AVX2 where the CPU has it)
// only because the project builds with -fno-math-errno (src/CMakeLists.txt): with errno,
// GCC kept a scalar sqrt, two divisions and an errno branch per float (40 ms per step on
// the bench MoE; checked with objdump).
// With pb, the new p rounded to bf16 goes there too (bf16 training's kept copy of p, see
// bf16_copy_rows): the products' next rounding of p, without a pass of its own.
MINIMIND_NO_FMA_BEGIN
template <bool kRound>
MINIMIND_CPU_CLONES void adamw_update(float* __restrict p, const float* __restrict g, float g_scale,
                                      float* __restrict m, float* __restrict v,
                                      uint16_t* __restrict pb, int64_t n, float decay, float b1,
                                      float one_minus_b1, float b2, float one_minus_b2,
                                      float sqrt_bc2, float eps, float neg_step_size) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * g_scale;
    const float pi = p[i] * decay;
    const float mi = m[i] * b1 + one_minus_b1 * gi;
    const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    m[i] = mi, v[i] = vi;
    p[i] = pi + neg_step_size * mi / denom;
    if (kRound) pb[i] = bf16_bits(p[i]);
  }
}
MINIMIND_NO_FMA_END

// One parameter's fused update: its buffers and the scalars of this step.
struct FusedUpdate {
  float *p, *g, g_scale, *m, *v;
  uint16_t* pb;  // p's kept bf16 copy, or nullptr
  int64_t n;
  float decay, b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, eps, neg_step_size;
};

// Runs the updates over the cores in chunks of at most kChunk floats (1 MiB of each of the
// four buffers; the update is memory-bound, and two cores moved ~2x one core's bytes here).
// Each element's arithmetic is the same whichever thread runs it: same numbers.
void run_fused_updates(const std::vector<FusedUpdate>& updates) {
  constexpr int64_t kChunk = int64_t{1} << 18;
  struct Chunk {
    const FusedUpdate* u;
    int64_t begin, n;
  };
  std::vector<Chunk> chunks;
  for (const FusedUpdate& u : updates)
    for (int64_t b = 0; b < u.n; b += kChunk) chunks.push_back({&u, b, std::min(kChunk, u.n - b)});
  run_blas_tasks(static_cast<int64_t>(chunks.size()), [&](int64_t i) {
    const Chunk& c = chunks[static_cast<size_t>(i)];
    const FusedUpdate& u = *c.u;
    (u.pb ? adamw_update<true> : adamw_update<false>)(u.p + c.begin, u.g + c.begin, u.g_scale,
                                                      u.m + c.begin, u.v + c.begin,
                                                      u.pb ? u.pb + c.begin : nullptr, c.n, u.decay,
                                                      u.b1, u.one_minus_b1, u.b2, u.one_minus_b2,
                                                      u.sqrt_bc2, u.eps, u.neg_step_size);
  });
}

// The tensors' indices, largest first (tasks for run_blas_tasks).
std::vector<int64_t> largest_first(const std::vector<torch::Tensor>& tensors) {
  std::vector<int64_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return tensors[static_cast<size_t>(a)].numel() > tensors[static_cast<size_t>(b)].numel();
  });
  return order;
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  std::vector<FusedUpdate> fused;
  std::vector<torch::Tensor> rounded_here;  // parameters whose kept bf16 copy the update writes
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "FusedAdamW has no AMSGrad");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const torch::Tensor& grad = p.grad();
      const bool fusable = p.scalar_type() == torch::kFloat32 &&
                           grad.scalar_type() == torch::kFloat32 && p.is_contiguous() &&
                           grad.is_contiguous() && !grad.is_sparse();
      const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto found = state().find(key);
      if (found == state().end()) {  // as torch: zero moments, step 0
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        found = state().emplace(key, std::move(fresh)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*found->second);
      st.step(st.step() + 1);
      const auto [beta1, beta2] = o.betas();
      const double bias_correction1 = 1 - std::pow(beta1, st.step());
      const double bias_correction2 = 1 - std::pow(beta2, st.step());
      const double step_size = o.lr() / bias_correction1;
      if (!fusable || !st.exp_avg().is_contiguous() || !st.exp_avg_sq().is_contiguous()) {
        // torch's AdamW step, op for op (a float64 model, an odd layout).
        if (gradient_scale_ != 1.0f) p.mutable_grad().mul_(gradient_scale_);
        if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
        st.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
        st.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
        const torch::Tensor denom =
            (st.exp_avg_sq().sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
        p.addcdiv_(st.exp_avg(), denom, -step_size);
        continue;
      }
      // The update writes p through its pointer: say so, as an in-place op would (a copy
      // made from p, such as its bf16 rounding, checks the version to know it is stale).
      torch::autograd::impl::bump_version(p);
      // The scalars as torch's ops receive them: doubles cast to the tensor's float.
      uint16_t* rounded = bf16_copy_rows(p);
      if (rounded) rounded_here.push_back(p);
      fused.push_back(
          {p.data_ptr<float>(), grad.data_ptr<float>(), gradient_scale_,
           st.exp_avg().data_ptr<float>(), st.exp_avg_sq().data_ptr<float>(), rounded, p.numel(),
           static_cast<float>(o.weight_decay() != 0 ? 1 - o.lr() * o.weight_decay() : 1),
           static_cast<float>(beta1), static_cast<float>(1 - beta1), static_cast<float>(beta2),
           static_cast<float>(1 - beta2), static_cast<float>(std::sqrt(bias_correction2)),
           static_cast<float>(o.eps()), static_cast<float>(-step_size)});
    }
  }
  run_fused_updates(fused);
  for (const auto& p : rounded_here) bf16_copy_written(p);
  return loss;
}

void FusedAdamW::step_scaled(float gradient_scale) {
  gradient_scale_ = gradient_scale;
  try {
    step();
  } catch (...) {
    gradient_scale_ = 1.0f;
    throw;
  }
  gradient_scale_ = 1.0f;
}

void fill_missing_gradients(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}

void clear_gradients(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();
}

namespace {

// Whether clipping can hand its scale to FusedAdamW::step_scaled: float32 gradients, whose
// product with the float32 scale the update forms as clipping's mul_ would (a float64
// model's gradients are multiplied by clipping itself, in float64).
bool can_defer(const std::vector<const std::vector<torch::Tensor>*>& lists) {
  for (const auto* list : lists)
    for (const auto& p : *list)
      if (p.grad().defined() && p.grad().scalar_type() != torch::kFloat32) return false;
  return true;
}

}  // namespace

double clip_gradients(const std::vector<torch::Tensor>& params, double max_norm, float* deferred) {
  torch::NoGradGuard no_grad;
  if (deferred) *deferred = 1.0f;
  if (max_norm > 0) {
    // torch::nn::utils::clip_grad_norm_ (LibTorch 1.13) op for op, its per-tensor norms and
    // products spread over the cores: each is the same one-thread ATen op on the same tensor
    // whichever thread runs it, so the numbers are clip_grad_norm_'s (tested).
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    if (grads.empty()) return 0.0;
    const std::vector<int64_t> order = largest_first(grads);
    std::vector<torch::Tensor> norms(grads.size());
    run_blas_tasks(order, [&](int64_t i) { norms[i] = grads[i].norm(2); });
    const torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
    const torch::Tensor coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
    if (deferred && can_defer({&params}))
      *deferred = coef.item<float>();  // a float32 scalar: the norm of float32 gradients
    else
      run_blas_tasks(order, [&](int64_t i) { grads[i].mul_(coef); });
    return total.item<double>();
  }
  torch::Tensor sq = torch::zeros({}, torch::kFloat64);
  for (const auto& p : params) sq += p.grad().to(torch::kFloat64).pow(2).sum();
  return std::sqrt(sq.item<double>());
}

double clip_gradients(const std::vector<torch::Tensor>& replicated,
                      const std::vector<torch::Tensor>& sharded, double max_norm,
                      Distributed& group, float* deferred) {
  torch::NoGradGuard no_grad;
  if (deferred) *deferred = 1.0f;
  // Squared norms summed in float64: the replicated part here, the sharded part over the
  // group (each rank holds other experts), so every rank finds the same total.
  auto squares = [](const std::vector<torch::Tensor>& params) {
    double sum = 0;
    for (const auto& p : params)
      if (p.grad().defined()) sum += std::pow(p.grad().norm(2).item<double>(), 2);
    return sum;
  };
  std::vector<double> sq{squares(sharded)};
  group.all_reduce_sum(sq);
  const double total = std::sqrt(squares(replicated) + sq[0]);
  if (max_norm > 0) {
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    if (deferred && can_defer({&replicated, &sharded})) {
      *deferred = static_cast<float>(coef);
      return total;
    }
    for (const auto* list : {&replicated, &sharded})
      for (const auto& p : *list)
        if (p.grad().defined()) p.grad().mul_(static_cast<float>(coef));
  }
  return total;
}

}  // namespace minimind
