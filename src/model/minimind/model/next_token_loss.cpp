#include "minimind/model/next_token_loss.h"

#include "minimind/util/blas_tasks.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnore = -100;

// f(first row, rows) over [0, rows) in blocks of 512 rows, the blocks spread over the cores
// (run_blas_tasks): the log-softmax over 6,400 words and its backward's exp are the
// largest single-threaded ops of a step (torch runs one intra-op thread, see compute_plan.h).
// Measured on the 2-core VM (minimind-bench --preset dense --profile): the backward 17 ->
// 10 ms; the log-softmax ~31 ms either way (two blocks at once each ran at half the speed
// of one alone: this VM's two cores share more than they should; a real pair would halve it).
// Each row's numbers are the same in any block: blocks start at a multiple of 512 rows,
// so ATen's vectorised loops split every block into the same vectors as the whole.
void for_row_blocks(int64_t rows, const std::function<void(int64_t, int64_t)>& f) {
  constexpr int64_t kBlock = 512;
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b * kBlock < rows; ++b) blocks.push_back(b);
  run_blas_tasks(blocks, [&](int64_t b) { f(b * kBlock, std::min(kBlock, rows - b * kBlock)); });
}

struct NextTokenLoss : torch::autograd::Function<NextTokenLoss> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& labels, bool mean) {
    const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
    const torch::Tensor flat = logits.reshape({B * T, V});
    torch::Tensor lsm = torch::empty_like(flat);  // [B*T, V]
    for_row_blocks(B * T, [&](int64_t r0, int64_t n) {
      torch::Tensor out = lsm.narrow(0, r0, n);
      at::_log_softmax_out(out, flat.narrow(0, r0, n), 1, false);
    });
    const torch::Tensor targets = labels.narrow(1, 1, T - 1);                  // [B, T-1]
    const torch::Tensor counted = targets != kIgnore;                          // [B, T-1]
    const torch::Tensor safe = targets.masked_fill(counted.logical_not(), 0);  // [B, T-1]
    // The log-probability of each label, as nll_loss's input of one class per row: the
    // rows, their order and the ignored ones are those of the sliced form.
    const torch::Tensor picked = lsm.view({B, T, V})
                                     .narrow(1, 0, T - 1)
                                     .gather(2, safe.unsqueeze(-1))
                                     .reshape({B * (T - 1), 1});  // [B*(T-1), 1]
    const torch::Tensor nll_targets =
        torch::full_like(safe, kIgnore).masked_fill_(counted, 0).reshape({-1});  // [B*(T-1)]
    const auto reduction = mean ? at::Reduction::Mean : at::Reduction::Sum;
    auto [loss, total_weight] = at::nll_loss_forward(picked, nll_targets, {}, reduction, kIgnore);
    ctx->save_for_backward({lsm, safe, counted, total_weight});
    ctx->saved_data["mean"] = mean;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::loss);
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];  // the log-probabilities, overwritten: not needed again
    const torch::Tensor &safe = saved[1], &counted = saved[2], &total_weight = saved[3];
    const int64_t B = safe.size(0), T = safe.size(1) + 1, V = grad.size(1);
    // nll_loss's backward puts v = -(grad / total weight) (mean) or -grad (sum) at each
    // label; log_softmax's turns that row into v * onehot - exp(lsm) * v.
    const torch::Tensor g = grad_out[0];
    const torch::Tensor v = (ctx->saved_data["mean"].toBool() ? g / total_weight : g).neg();
    const torch::Tensor minus_v = v.neg();
    for_row_blocks(B * T, [&](int64_t r0, int64_t n) {
      grad.narrow(0, r0, n).exp_().mul_(minus_v);  // -(exp(lsm) * v), [n, V]
    });
    torch::Tensor rows = grad.view({B, T, V}).narrow(1, 0, T - 1);  // [B, T-1, V]
    rows.scatter_add_(2, safe.unsqueeze(-1), v.expand({B, T - 1, 1}));
    grad.view({B, T, V}).select(1, T - 1).zero_();  // the last position predicts nothing
    if (!counted.all().item<bool>()) rows.masked_fill_(counted.logical_not().unsqueeze(-1), 0);
    return {grad.view({B, T, V}), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& labels, bool mean) {
  TORCH_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(1) >= 2,
              "next_token_loss: logits [B, T, V] and labels [B, T], T >= 2");
  const StepScope part(StepPart::loss);
  return NextTokenLoss::apply(logits.contiguous(), labels, mean);
}

}  // namespace minimind
