// One MoE layer's scalar router statistics for one optimizer step, listed once. The MoE
// layer fills them (moe_feed_forward.cpp), the optimizer step combines them over
// micro-batches, shards and ranks, the interval window over steps, and the run log writes
// them into expert_load.jsonl: every one of those walks fields(), so a new per-layer
// metric is one field here and the line that computes it (docs/development.md, "Add a
// per-layer metric"). Torch-free: the run log's reader includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace minimind {

// How a field combines over micro-batches (of which shards are parts), ranks and steps:
//   mean  micro-batches add value / accumulation_steps; ranks and steps average
//   sum   added everywhere
//   max   the largest value
//   last  the newest value that is set (figures taken after the optimizer step)
//   per_step  added over micro-batches and ranks; steps average (a step's total)
// Vectors combine element by element (sum, per_step) or as the newest (last).
enum class Combine { mean, sum, max, last, per_step };

// Whether expert_load.jsonl holds the field under its own name; the others are logged in a
// derived form (aux_unscaled = aux / coef, dropped as a fraction of the assignments).
enum class Logged { as_is, derived };

// A routing margin below this (in score units) counts as a near-tie (LayerStats::margin_small).
constexpr double kSmallMargin = 0.01;

struct LayerStats {
  double aux = 0;                           // the layer's aux loss (coef included); 0 without one
  std::optional<double> z;                  // mean_t logsumexp(router logits)^2 (learned router)
  std::optional<double> importance;         // CV² of the gate sums (importance loss / coef)
  std::optional<int64_t> dropped;           // assignments capacity dropped (real tokens)
  std::optional<double> seq_max_vio;        // max over the step's sequences of their MaxVio
  std::optional<std::vector<double>> bias;  // the selection bias after the step
  // The routing margin (learned choice, k < E): per token the lowest chosen minus the highest
  // unchosen of score + bias, the values top-k ran on; the mean over real tokens and the
  // share of them under kSmallMargin (a near-tie a small change flips).
  std::optional<double> margin, margin_small;
  // The share of a fixed probe batch's tokens whose top-k set changed since the previous
  // log step (the trainer re-routes the probe at log steps; unset at the first).
  std::optional<double> routing_change;
  // The router weight's gradient by source, ||dLM/dW_gate|| and ||d(aux+z)/dW_gate|| of the
  // step before clipping (at log steps, when the trainer asks).
  std::optional<double> grad_lm, grad_balance;
  // Expert parallelism: token rows the layer's forward sent from rank s of the expert group
  // to rank d, at [s * N + d] (each rank fills its row; the ranks' sum is the matrix), per
  // step: the all-to-all's imbalance. Received by d: the column's sum.
  std::optional<std::vector<double>> exchange;
  // How alike the routed experts' weights are, after the step (at log steps, when the
  // trainer asks): the cosine of each pair's flattened gate/up/down weights, the pairs
  // (0,1), (0,2), ..., (E-2,E-1) in order, and their mean and largest value. Upcycled experts
  // start at 1 and separate as they train.
  std::optional<std::vector<double>> expert_similarity;
  std::optional<double> expert_similarity_mean, expert_similarity_max;

  // Calls f(name, combine, logged, s.field...) for each field, walking several records in
  // step (e.g. a sum and the record added to it).
  template <class F, class... S>
  static void fields(F&& f, S&... s) {
    f("aux", Combine::mean, Logged::derived, s.aux...);
    f("z", Combine::mean, Logged::as_is, s.z...);
    f("importance", Combine::mean, Logged::as_is, s.importance...);
    f("dropped", Combine::sum, Logged::derived, s.dropped...);
    f("seq_max_vio", Combine::max, Logged::as_is, s.seq_max_vio...);
    f("bias", Combine::last, Logged::as_is, s.bias...);
    f("margin", Combine::mean, Logged::as_is, s.margin...);
    f("margin_small", Combine::mean, Logged::as_is, s.margin_small...);
    f("routing_change", Combine::last, Logged::as_is, s.routing_change...);
    f("grad_lm", Combine::last, Logged::as_is, s.grad_lm...);
    f("grad_balance", Combine::last, Logged::as_is, s.grad_balance...);
    f("exchange", Combine::per_step, Logged::as_is, s.exchange...);
    f("expert_similarity", Combine::last, Logged::as_is, s.expert_similarity...);
    f("expert_similarity_mean", Combine::last, Logged::as_is, s.expert_similarity_mean...);
    f("expert_similarity_max", Combine::last, Logged::as_is, s.expert_similarity_max...);
  }
};

namespace layer_stats {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// Adds `from` into `into` as Combine says; `divisor` divides mean fields (the accumulation
// steps when adding a micro-batch; 1 when adding a step to an interval's sums).
inline void add(LayerStats& into, const LayerStats& from, double divisor) {
  LayerStats::fields(
      [divisor](const char*, Combine how, Logged, auto& dst, const auto& src) {
        using T = std::decay_t<decltype(dst)>;
        auto combine = [&](auto& d, const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_arithmetic_v<V>) {
            if (how == Combine::mean) d += static_cast<V>(v / divisor);
            if (how == Combine::sum || how == Combine::per_step) d += v;
            if (how == Combine::max) d = std::max(d, v);
            if (how == Combine::last) d = v;
          } else if (how == Combine::sum || how == Combine::per_step) {
            if (d.size() < v.size()) d.resize(v.size());
            for (size_t i = 0; i < v.size(); ++i) d[i] += v[i];
          } else {
            d = v;  // the newest
          }
        };
        if constexpr (is_optional<T>::value) {
          if (!src.has_value()) return;
          if (!dst.has_value()) dst.emplace();  // 0 (or empty): adding to it gives the value
          combine(*dst, *src);
        } else {
          combine(dst, src);
        }
      },
      into, from);
}

// Adds `from` layer by layer, growing `into` to its length.
inline void add(std::vector<LayerStats>& into, const std::vector<LayerStats>& from,
                double divisor) {
  if (into.size() < from.size()) into.resize(from.size());
  for (size_t l = 0; l < from.size(); ++l) add(into[l], from[l], divisor);
}

}  // namespace layer_stats
}  // namespace minimind
