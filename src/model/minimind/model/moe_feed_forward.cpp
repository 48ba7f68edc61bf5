#include "minimind/model/moe_feed_forward.h"

#include "minimind/model/linear.h"

namespace minimind {

MOEFeedForwardImpl::MOEFeedForwardImpl(const ModelConfig& cfg)
    : num_experts_(cfg.num_experts),
      top_k_(cfg.num_experts_per_tok),
      norm_topk_prob_(cfg.norm_topk_prob),
      aux_coef_(cfg.router_aux_loss_coef) {
  gate = register_module("gate", linear_no_bias(cfg.hidden_size, num_experts_));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts_; ++e) {
    expert_list_.emplace_back(cfg.hidden_size, cfg.expert_ffn_size());
    experts->push_back(expert_list_.back());
  }
}

MoEOutput MOEFeedForwardImpl::forward(const torch::Tensor& x, const torch::Tensor& real) {
  const int64_t H = x.size(-1);
  torch::Tensor x_flat = x.reshape({-1, H});                // [N, H]
  torch::Tensor scores = torch::softmax(gate(x_flat), -1);  // [N, E]
  auto [weight, index] = torch::topk(scores, top_k_, -1, /*largest=*/true, /*sorted=*/false);
  if (norm_topk_prob_) weight = weight / (weight.sum(-1, /*keepdim=*/true) + 1e-20);  // [N, k]

  // Sorted dispatch: order the N*k (token, slot) assignments by expert so each expert
  // runs once on one contiguous slice; a stable sort keeps tokens ascending inside a
  // slice, so each expert sees its rows in the same order as MiniMind's masked loop.
  torch::Tensor flat_index = index.reshape({-1});                        // [N*k]
  torch::Tensor counts = torch::bincount(flat_index, {}, num_experts_);  // [E]
  torch::Tensor order = std::get<1>(torch::sort(flat_index, /*stable=*/true, 0, false));
  torch::Tensor token = torch::div(order, top_k_, "floor");  // [N*k]
  torch::Tensor xs = x_flat.index_select(0, token);          // [N*k, H]

  std::vector<torch::Tensor> outs;
  torch::Tensor unused_params;  // sum of the parameters of experts no token picked
  const int64_t* count = counts.data_ptr<int64_t>();
  for (int64_t e = 0, offset = 0; e < num_experts_; ++e) {
    if (count[e] > 0) {
      outs.push_back(expert_list_[e](xs.narrow(0, offset, count[e])));
      offset += count[e];
    } else if (is_training()) {
      for (const auto& p : expert_list_[e]->parameters()) {
        unused_params = unused_params.defined() ? unused_params + p.sum() : p.sum();
      }
    }
  }
  torch::Tensor ys = torch::cat(outs, 0);  // [N*k, H]
  ys = ys * weight.reshape({-1}).index_select(0, order).unsqueeze(1);
  torch::Tensor y = torch::zeros_like(x_flat).index_add(0, token, ys.to(x_flat.scalar_type()));
  // As MiniMind: an idle expert joins the graph with a zero gradient, so every parameter
  // gets a gradient on every step (AdamW then decays it, and all ranks agree under DDP).
  if (unused_params.defined()) y = y + 0 * unused_params;

  torch::Tensor aux;
  if (is_training() && aux_coef_ > 0) {
    // MiniMind's form keeps the top-k axis (load is [k, E]), so its floor is k * coef.
    torch::Tensor load = torch::one_hot(index, num_experts_).to(torch::kFloat32).mean(0);
    aux = (load * scores.mean(0)).sum() * static_cast<double>(num_experts_) * aux_coef_;
  } else {
    aux = torch::zeros({}, scores.options());
  }
  if (real.defined()) {  // load statistics over real tokens only
    torch::Tensor keep = real.unsqueeze(1).expand_as(index).reshape({-1});  // [N*k]
    counts = torch::bincount(flat_index.masked_select(keep), {}, num_experts_);
  }
  return {y.view(x.sizes()), aux, counts};
}

}  // namespace minimind
