#include "minimind/model/next_token_loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "minimind/model/linear.h"
#include "minimind/model/vector_math.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnore = -100;

// The loss's passes over [B*T, V] run in row blocks over the cores (run_row_blocks): the
// log-softmax over 6,400 words and its backward's exp are the largest single-threaded ops of
// a step (torch runs one intra-op thread, see compute_plan.h). Measured on the 2-core VM
// (minimind-bench --preset dense --profile): the backward 17 -> 10 ms; the log-softmax ~31 ms
// either way (two blocks at once each ran at half the speed of one alone: this VM's two cores
// share more than they should; a real pair would halve it). Each row's numbers are the same
// in any block: blocks start at a multiple of 512 (or 32) rows, so ATen's vectorised loops
// split every block into the same vectors as the whole.
constexpr int64_t kRowBlock = 512;

// Training's log-softmax and its backward where the products leave ATen (bf16, or fp32 on
// oneDNN: node_choice.h): the formulas of ATen's kernels, in loops of our own. Why: ATen
// 1.13 as Debian builds it runs e^x through Sleef's AVX2 code even on an AVX-512 CPU, in
// three passes over [B*T, V] floats each way; these run e^x in AVX-512 (exp_clamped, about 2
// ulp where Sleef's is 1) and form each row's gradient (rounded in bf16) in one pass. fp32 on
// OpenBLAS, evaluation and generation keep ATen's numbers.
MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
// out = (x - max) - log(sum(e^(x - max))) per row of V; out may be x.
MINIMIND_CPU_CLONES void log_softmax_rows(const float* x, float* out, int64_t rows, int64_t V) {
  for (int64_t r = 0; r < rows; ++r, x += V, out += V) {
    const float mx = max_lanes(x, V);
    const float log_sum = std::log(sum_exp_lanes(x, V, mx));
    // out is x or apart from it: each element is read before it is written
    MINIMIND_INDEPENDENT_ITERATIONS
    for (int64_t j = 0; j < V; ++j) out[j] = (x[j] - mx) - log_sum;
  }
}

// One row of the loss's gradient from its log-probabilities: e^lsm * (-v), plus v at the
// label (nll_loss's and log_softmax's backward, as NextTokenLoss forms them with ATen's
// ops), in place; a row of zeros for label < 0 (the last position, or an ignored label).
MINIMIND_CPU_CLONES void loss_gradient_row(float* lsm, int64_t V, int64_t label, float v) {
  if (label < 0) {
    std::fill(lsm, lsm + V, 0.0f);
    return;
  }
  for (int64_t j = 0; j < V; ++j) lsm[j] = exp_clamped(lsm[j]) * -v;
  lsm[label] += v;
}

// One row x [V] of logits with its label, in place (training's head and loss): returns the
// label's log-probability, (x - max) - log(sum(e^(x - max))) at the label, bit for bit as
// log_softmax_rows forms it, and writes the row's gradient for a unit upstream gradient,
// onehot(label) - softmax(x), into u as the products' operand E (rounded in bf16). x is left
// holding e^(x - max).
template <typename E>
MINIMIND_CPU_CLONES float loss_row(float* __restrict x, E* __restrict u, int64_t V, int64_t label) {
  const float mx = max_lanes(x, V), at_label = x[label];
  const float sum = exp_sum_lanes(x, V, mx), inv = 1.0f / sum;
  for (int64_t j = 0; j < V; ++j) u[j] = as_operand<E>(-(x[j] * inv));
  u[label] = as_operand<E>(1.0f - x[label] * inv);
  return (at_label - mx) - std::log(sum);
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

// Whether a loss takes the loops above: in training outside ATen (node_choice.h).
enum class Kernels : bool { aten, own };

// What the loss's backward needs from its forward.
struct LossSaved {
  torch::Tensor loss, safe, counted, total_weight;  // [], [B, T-1] x2, []
};

// The labels' mask: safe [B, T-1], the labels with the ignored ones at 0, and counted
// [B, T-1], whether a label counts (labels[:, t] for t >= 1 are the targets of t - 1).
struct LabelMask {
  torch::Tensor safe, counted;
  explicit LabelMask(const torch::Tensor& labels) {
    const torch::Tensor targets = labels.narrow(1, 1, labels.size(1) - 1);  // [B, T-1]
    counted = targets != kIgnore;
    safe = targets.masked_fill(counted.logical_not(), 0);
  }
};

// The loss from the labels' log-probabilities picked [B*(T-1), 1] (any value at an ignored
// label), as nll_loss's input of one class per row: the rows, their order and the ignored
// ones are those of the sliced form.
LossSaved nll_of_picked(const torch::Tensor& picked, const LabelMask& mask, bool mean) {
  const torch::Tensor nll_targets = torch::full_like(mask.safe, kIgnore)
                                        .masked_fill_(mask.counted, 0)
                                        .reshape({-1});  // [B*(T-1)]
  const auto reduction = mean ? at::Reduction::Mean : at::Reduction::Sum;
  auto [loss, total_weight] = at::nll_loss_forward(picked, nll_targets, {}, reduction, kIgnore);
  return {loss, mask.safe, mask.counted, total_weight};
}

// The loss from flat logits [B*T, V], overwritten by their log-probabilities (lsm may be
// logits itself: each row is read whole before it is written).
LossSaved log_softmax_nll(const torch::Tensor& flat, torch::Tensor lsm, const torch::Tensor& labels,
                          bool mean, Kernels kernels) {
  const int64_t B = labels.size(0), T = labels.size(1), V = flat.size(1);
  run_row_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t n) {
    torch::Tensor out = lsm.narrow(0, r0, n);
    if (kernels == Kernels::own)
      log_softmax_rows(flat.data_ptr<float>() + r0 * V, out.data_ptr<float>(), n, V);
    else
      at::_log_softmax_out(out, flat.narrow(0, r0, n), 1, false);
  });
  const LabelMask mask(labels);
  const torch::Tensor picked = lsm.view({B, T, V})
                                   .narrow(1, 0, T - 1)
                                   .gather(2, mask.safe.unsqueeze(-1))
                                   .reshape({B * (T - 1), 1});  // [B*(T-1), 1]
  return nll_of_picked(picked, mask, mean);
}

// v = -(grad / total weight) (mean) or -grad (sum): what nll_loss's backward puts at each
// label; log_softmax's turns that row into v * onehot - exp(lsm) * v.
torch::Tensor label_gradient(const torch::Tensor& g, const torch::Tensor& total_weight, bool mean) {
  return (mean ? g / total_weight : g).neg();
}

void save(AutogradContext* ctx, const LossSaved& s, const torch::Tensor& lsm, bool mean) {
  ctx->save_for_backward({lsm, s.safe, s.counted, s.total_weight});
  ctx->saved_data["mean"] = mean;
}

// The labels as the own loops read them: contiguous [B, T-1] copies.
class LabelRows {
 public:
  LabelRows(const torch::Tensor& safe_labels, const torch::Tensor& counted_labels)
      : safe_(safe_labels.contiguous()),
        counted_(counted_labels.contiguous()),
        label_(safe_.data_ptr<int64_t>()),
        is_counted_(counted_.data_ptr<bool>()) {}
  // Row r of the flat [B*T, ...] rows predicts label (r / T, r % T), at this place of the
  // [B, T-1] copies.
  static int64_t at(int64_t r, int64_t T) { return r / T * (T - 1) + r % T; }
  // Row r's target, or -1 where it predicts nothing (the last position) or its label is
  // ignored: a row of zeros in the gradient.
  int64_t target(int64_t r, int64_t T) const {
    return r % T == T - 1 || !is_counted_[at(r, T)] ? -1 : label_[at(r, T)];
  }

 private:
  torch::Tensor safe_, counted_;
  const int64_t* label_;
  const bool* is_counted_;
};

struct NextTokenLoss : torch::autograd::Function<NextTokenLoss> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& labels, bool mean, bool own_kernels) {
    const int64_t V = logits.size(2);
    const torch::Tensor flat = logits.reshape({-1, V});
    torch::Tensor lsm = torch::empty_like(flat);  // [B*T, V]
    const LossSaved s =
        log_softmax_nll(flat, lsm, labels, mean, own_kernels ? Kernels::own : Kernels::aten);
    save(ctx, s, lsm, mean);
    ctx->saved_data["own"] = own_kernels;
    return s.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::loss);
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];  // the log-probabilities, overwritten: not needed again
    const torch::Tensor &safe = saved[1], &counted = saved[2], &total_weight = saved[3];
    const int64_t B = safe.size(0), T = safe.size(1) + 1, V = grad.size(1);
    const torch::Tensor v =
        label_gradient(grad_out[0], total_weight, ctx->saved_data["mean"].toBool());
    if (ctx->saved_data["own"].toBool()) {
      const LabelRows rows(safe, counted);
      const float v_value = v.item<float>();
      float* lsm = grad.data_ptr<float>();
      run_row_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t n) {
        for (int64_t r = r0; r < r0 + n; ++r)
          loss_gradient_row(lsm + r * V, V, rows.target(r, T), v_value);
      });
      return {grad.view({B, T, V}), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    const torch::Tensor minus_v = v.neg();
    run_row_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t n) {
      grad.narrow(0, r0, n).exp_().mul_(minus_v);  // -(exp(lsm) * v), [n, V]
    });
    torch::Tensor rows = grad.view({B, T, V}).narrow(1, 0, T - 1);  // [B, T-1, V]
    rows.scatter_add_(2, safe.unsqueeze(-1), v.expand({B, T - 1, 1}));
    grad.view({B, T, V}).select(1, T - 1).zero_();  // the last position predicts nothing
    if (!counted.all().item<bool>()) rows.masked_fill_(counted.logical_not().unsqueeze(-1), 0);
    return {grad.view({B, T, V}), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The head's product and the loss as one node in training outside ATen: logits [B*T, V] =
// h @ w^T as project() computes them (bf16(h) @ bf16(w)^T with fp32 sums, or fp32 on
// oneDNN), then in one pass over each row its softmax, the label's log-probability and the
// row's gradient for a unit upstream gradient, onehot - softmax, as the backward's products'
// operand E (rounded to bf16, or float). The backward scales their fp32 results by the
// upstream gradient (the mean's 1 / count included): the logits' gradient is a multiple of
// that one matrix.
//
// Why: the unfused form wrote the log-probabilities over the logits and formed the gradient
// from them in the backward, running e^x over [B*T, V] twice, the largest elementwise work of
// a bf16 step; here it runs once, and the backward has no pass over [B*T, V] of its own. The
// loss is bitwise the unfused one; the gradients differ from it in how they round:
// E(onehot - p) scaled after the products, where the unfused form rounds v (onehot - p).
// Forming the logits 16-256 rows at a time in cache was no faster: the row loops are
// bound by e^x, not memory, and the head's product ran 10-45 % slower in row blocks
// (docs/benchmarks/2026-12-05-amd-bf16-loss-softmax-casts.md).
template <typename E>
struct HeadNextTokenLossFused : torch::autograd::Function<HeadNextTokenLossFused<E>> {
  static constexpr Precision kPrecision = operand_precision<E>;
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& labels, bool mean) {
    const torch::Tensor hs = to_operand(h.reshape({-1, h.size(-1)}), kPrecision);  // [B*T, H]
    const torch::Tensor ws = to_operand(w, kPrecision, /*parameter=*/true);        // [V, H]
    const int64_t B = labels.size(0), T = labels.size(1), V = ws.size(0);
    torch::Tensor logits;  // [B*T, V]
    in_part(StepPart::product_forward, [&] { logits = matmul(hs, ws.t(), node_products<E>); });
    const LabelMask mask(labels);
    const LabelRows rows(mask.safe, mask.counted);
    torch::Tensor picked = torch::zeros({B * (T - 1), 1}, h.options());  // [B*(T-1), 1]
    torch::Tensor unit = torch::empty({B * T, V}, h.options().dtype(operand_dtype<E>));
    auto* unit_rows = static_cast<E*>(unit.data_ptr());
    float* picked_at = picked.data_ptr<float>();
    float* x = logits.data_ptr<float>();
    run_row_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t n) {
      for (int64_t r = r0; r < r0 + n; ++r) {
        E* u = unit_rows + r * V;
        const int64_t target = rows.target(r, T);
        if (target < 0)
          std::fill(u, u + V, E{0});
        else
          picked_at[LabelRows::at(r, T)] = loss_row(x + r * V, u, V, target);
      }
    });
    const LossSaved s = nll_of_picked(picked, mask, mean);
    ctx->save_for_backward({unit, s.total_weight, hs, ws});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["h_shape"] = h.sizes().vec();
    return s.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::loss);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &unit = saved[0], &total_weight = saved[1], &hs = saved[2], &ws = saved[3];
    // The logits' gradient is v * (onehot - p) = v * unit (NextTokenLoss's backward).
    const float v =
        label_gradient(grad_out[0], total_weight, ctx->saved_data["mean"].toBool()).item<float>();
    torch::Tensor gh, gw;
    in_part(StepPart::product_grad_input, [&] { gh = matmul(unit, ws, node_products<E>); });
    // A frozen output projection (train.freeze: [embeddings]) takes no gradient.
    const bool weight_grad = ctx->needs_input_grad(1);
    if (weight_grad)
      in_part(StepPart::product_grad_weight, [&] { gw = matmul(unit.t(), hs, node_products<E>); });
    // With no label counted, unit is all zero and so are gh and gw, as the unfused form's
    // gradient; v (upstream / 0 for the mean) would turn them into NaN.
    if (total_weight.item<double>() > 0) {
      gh.mul_(v);
      if (weight_grad) gw.mul_(v);
    }
    return {gh.view(ctx->saved_data["h_shape"].toIntVector()), gw, torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& labels, bool mean,
                              NodeChoice node) {
  TORCH_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(1) >= 2,
              "next_token_loss: logits [B, T, V] and labels [B, T], T >= 2");
  const StepScope part(StepPart::loss);
  // Training outside ATen takes the own loops (as head_next_token_loss does), the rest ATen's.
  return NextTokenLoss::apply(logits.contiguous(), labels, mean,
                              logits.requires_grad() && runs_own_node(node, logits));
}

torch::Tensor head_next_token_loss(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& labels, const Products& products,
                                   bool mean) {
  TORCH_CHECK(h.dim() == 3 && labels.dim() == 2 && h.size(1) >= 2 && w.size(1) == h.size(2),
              "head_next_token_loss: h [B, T, H], w [V, H] and labels [B, T], T >= 2");
  TORCH_CHECK(products.leave_aten(), "head_next_token_loss: bf16, or fp32 on oneDNN");
  const StepScope part(StepPart::loss);
  if (products.precision == Precision::bf16)
    return HeadNextTokenLossFused<uint16_t>::apply(h.contiguous(), w, labels, mean);
  return HeadNextTokenLossFused<float>::apply(h.contiguous(), w, labels, mean);
}

}  // namespace minimind
