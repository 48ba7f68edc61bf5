// What a MoE layer is built from: the slice of ModelConfig it reads, resolved once, so the
// module holds its own options rather than the whole model's config.
#pragma once

#include <cstdint>

#include "minimind/choices.h"
#include "minimind/config.h"
#include "minimind/model/expert_exchange.h"
#include "minimind/util/products.h"

namespace minimind {

// The balancing lab's switches (docs/moe-routing.md, "Balancing methods, exactly"), read from
// the config's keys; their defaults live in ModelConfig (config.h) only: a default-made
// BalancingOptions is ModelConfig{}'s, MiniMind-3's routing.
struct BalancingOptions {
  AuxScope aux_scope{};
  double aux_coef{};         // router_aux_loss_coef
  double z_coef{};           // router_z_loss_coef
  double importance_coef{};  // router_importance_loss_coef
  double bias_rate{};        // router_bias_update_rate: aux-loss-free selection bias
  BiasRule bias_rule{};      // router_bias_rule
  QbEstimator qb_estimator{};
  int64_t qb_bins{};
  double qb_ema{};
  double capacity_factor{};  // 0: dropless; else C = ceil(cf * k * T / E)
  DropPolicy drop_policy{};

  BalancingOptions() : BalancingOptions(ModelConfig()) {}
  explicit BalancingOptions(const ModelConfig& m)
      : aux_scope(m.aux_loss_scope),
        aux_coef(m.router_aux_loss_coef),
        z_coef(m.router_z_loss_coef),
        importance_coef(m.router_importance_loss_coef),
        bias_rate(m.router_bias_update_rate),
        bias_rule(m.router_bias_rule),
        qb_estimator(m.qb_estimator),
        qb_bins(m.qb_num_bins),
        qb_ema(m.qb_ema),
        capacity_factor(m.capacity_factor),
        drop_policy(m.capacity_drop_policy) {}

  bool dropless() const { return capacity_factor <= 0; }
  bool quantile() const { return bias_rule == BiasRule::quantile; }
  bool selection_bias() const { return bias_rate > 0 || quantile(); }
};

// Made by from(), which fills every field from the config (defaults live in config.h).
struct MoEOptions {
  int64_t hidden_size{}, num_experts{}, top_k{};
  int64_t expert_ffn_size{};
  int64_t shared_experts{}, shared_ffn_size{};
  bool norm_topk_prob{};
  RouterKind router{};
  ScoringFunc scoring{};
  double routed_scaling{};  // the routed weights' factor (DeepSeek's routed_scaling_factor)
  // A hash-routed layer (one of the first hash_layers): a fixed token -> k experts table
  // over vocab_size ids chooses; the gate only weighs; no bias and no balancing loss.
  bool hash_layer{};
  HashTable hash_table{};
  int64_t vocab_size{};
  BalancingOptions balancing;
  ExpertShard shard;  // the routed experts this process holds (keep_expert_shard sets it)
  Products products;  // the compute plan's (the experts' forward: experts_node)

  bool learned_router() const { return router == RouterKind::learned; }

  // Layer `layer` (0-based) of the model, built with `products`.
  static MoEOptions from(const ModelConfig& m, int64_t layer = 0, const Products& products = {}) {
    MoEOptions o;
    o.products = products;
    o.hash_layer = m.learned_router() && layer < m.hash_layers;
    o.hash_table = m.hash_table, o.vocab_size = m.vocab_size;
    o.hidden_size = m.hidden_size, o.num_experts = m.num_experts;
    o.top_k = m.num_experts_per_tok, o.expert_ffn_size = m.expert_ffn_size();
    o.shared_experts = m.n_shared_experts, o.shared_ffn_size = m.shared_ffn_size();
    o.norm_topk_prob = m.norm_topk_prob, o.router = m.router, o.scoring = m.scoring_func;
    o.routed_scaling = m.routed_scaling_factor;
    o.balancing = BalancingOptions(m);
    return o;
  }
};

}  // namespace minimind
