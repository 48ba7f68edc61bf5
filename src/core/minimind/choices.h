// The config's closed choices as enums, with the one table of their YAML names. Parsed
// once (config_yaml.cpp): a value outside the table is a config error naming key and line,
// and code compares enums, so a misspelt choice cannot compile into a default branch.
#pragma once

#include <array>
#include <string>

namespace minimind {

// model.aux_loss_scope: over which tokens the aux loss's expert shares f_e are counted.
enum class AuxScope { batch, sequence, global };
// model.scoring_func: the router's scores (softmax over experts, DeepSeek-V3's sigmoid, or
// DeepSeek-V4's sqrt(softplus(logit))).
enum class ScoringFunc { softmax, sigmoid, sqrtsoftplus };
// model.router_bias_rule: how the selection bias follows the load (DeepSeek-V3's sign step,
// or quantile balancing: the bias solved from quantiles of the step's scores).
enum class BiasRule { sign, quantile };
// model.qb_estimator: quantile balancing's estimate of each expert's quantile (torchtitan's
// histogram, or the exact order statistic).
enum class QbEstimator { histogram, exact };
// model.hash_table: the token -> experts table of the hash-routed first layers (Megatron's
// round robin (t + j) mod E, or torchtitan's random k-subset per token).
enum class HashTable { round_robin, random };
// model.capacity_drop_policy: which assignments over an expert's capacity are dropped.
enum class DropPolicy { probs, position };
// model.router: the learned router, or a control that routes without a score.
enum class RouterKind { learned, random, hash };
// run.precision: the matrix products' input precision (docs/precision.md). bf16 rounds their
// inputs to bfloat16 and accumulates in fp32; weights, gradients and everything else stay fp32.
enum class Precision { fp32, bf16 };
// run.matmul: which library runs the fp32 products ("auto": a rule on the CPU's instruction
// sets, auto_matmul in util/matmul.h). bf16 products always run on oneDNN.
enum class MatmulBackend { automatic, openblas, onednn };

// choice_names<E>(): the YAML name of each value, in the enum's order.
template <class E>
struct ChoiceNames;
template <>
struct ChoiceNames<AuxScope> {
  static constexpr std::array<const char*, 3> names{"batch", "sequence", "global"};
};
template <>
struct ChoiceNames<ScoringFunc> {
  static constexpr std::array<const char*, 3> names{"softmax", "sigmoid", "sqrtsoftplus"};
};
template <>
struct ChoiceNames<DropPolicy> {
  static constexpr std::array<const char*, 2> names{"probs", "position"};
};
template <>
struct ChoiceNames<BiasRule> {
  static constexpr std::array<const char*, 2> names{"sign", "quantile"};
};
template <>
struct ChoiceNames<QbEstimator> {
  static constexpr std::array<const char*, 2> names{"histogram", "exact"};
};
template <>
struct ChoiceNames<HashTable> {
  static constexpr std::array<const char*, 2> names{"round_robin", "random"};
};
template <>
struct ChoiceNames<RouterKind> {
  static constexpr std::array<const char*, 3> names{"learned", "random", "hash"};
};

template <>
struct ChoiceNames<Precision> {
  static constexpr std::array<const char*, 2> names{"fp32", "bf16"};
};
template <>
struct ChoiceNames<MatmulBackend> {
  static constexpr std::array<const char*, 3> names{"auto", "openblas", "onednn"};
};

template <class E>
const char* name_of(E value) {
  return ChoiceNames<E>::names[static_cast<size_t>(value)];
}

// The value named `name`; false when the table has no such name.
template <class E>
bool parse_choice(const std::string& name, E& out) {
  const auto& names = ChoiceNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) {
      out = static_cast<E>(i);
      return true;
    }
  return false;
}

// "\"batch\", \"sequence\", \"global\"" for messages.
template <class E>
std::string choice_list() {
  std::string out;
  for (const char* n : ChoiceNames<E>::names)
    out += (out.empty() ? "\"" : ", \"") + std::string(n) + "\"";
  return out;
}

}  // namespace minimind
