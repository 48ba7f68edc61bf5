#include "minimind/train/bench.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "minimind/error.h"
#include "minimind/model/minimind_model.h"
#include "minimind/train/optim.h"
#include "minimind/train/train_step.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

Config bench_config(const std::string& preset, const std::vector<std::string>& sets) {
  Config cfg = load_config_string(
      "model: {hidden_size: 256, num_hidden_layers: 4, num_attention_heads: 8, "
      "num_key_value_heads: 2,\n"
      "        vocab_size: 6400, num_experts: 4, norm_topk_prob: false}\n"
      "data: {max_seq_len: 256}\ntrain: {batch_size: 8}\n",
      "bench");
  cfg.model.use_moe = preset != "dense";
  cfg.model.num_experts_per_tok = preset == "moe-top2" ? 2 : 1;
  if (preset == "moe-e16k4" || preset == "moe-e64k16") {  // DeepSeekMoE-style fine grain
    const int64_t E = preset == "moe-e16k4" ? 16 : 64;
    cfg.model.num_experts = E;
    cfg.model.num_experts_per_tok = E / 4;
    cfg.model.moe_intermediate_size = cfg.model.ffn_size() * 4 / E;  // 832 -> 208, 52
  }
  for (const auto& assignment : sets) apply_override(cfg, assignment);
  for (const auto& w : validate_and_resolve(cfg)) spdlog::warn("{}", w);
  return cfg;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<VariantSpeed> compare_variants(
    const Config& base, const std::vector<std::string>& specs, int steps, int warmup,
    const std::function<ComputePlan(const Config&)>& plan_for) {
  struct Variant {
    std::string name;
    Config cfg;
    ComputePlan plan;
    MiniMindForCausalLM model{nullptr};
    std::unique_ptr<torch::optim::AdamW> opt;
    std::vector<double> seconds;
  };
  std::vector<Variant> variants;
  std::vector<std::string> all{"default:"};
  all.insert(all.end(), specs.begin(), specs.end());
  for (const auto& spec : all) {
    const size_t colon = spec.find(':');
    if (colon == std::string::npos || colon == 0)
      throw ConfigError("--variant '" + spec + "': expected NAME:section.key=value,...");
    Variant v;
    v.name = spec.substr(0, colon);
    v.cfg = base;
    std::stringstream sets(spec.substr(colon + 1));
    for (std::string set; std::getline(sets, set, ',');)
      if (!set.empty()) apply_override(v.cfg, set);
    for (const auto& w : validate_and_resolve(v.cfg)) spdlog::warn("{}: {}", v.name, w);
    v.plan = plan_for(v.cfg);
    torch::manual_seed(0);
    v.model = MiniMindForCausalLM(v.cfg.model, v.plan.products());
    init_weights(v.model);
    v.model->train();
    v.opt = make_optimizer(v.model->parameters(), v.cfg.train);
    variants.push_back(std::move(v));
  }
  const int64_t B = base.train.batch_size, T = base.data.max_seq_len;
  torch::Tensor ids = torch::randint(3, base.model.vocab_size, {B, T}, torch::kLong);  // [B, T]
  for (int s = 0; s < warmup + steps; ++s)
    for (auto& v : variants) {
      StepOptions so;
      so.grad_clip = v.cfg.train.grad_clip, so.lr = v.cfg.train.learning_rate;
      so.shards = v.plan.shards;
      const ComputeScope compute(v.plan);
      const Stopwatch clock;
      optimizer_step(
          v.model, *v.opt,
          [&] {
            return Batch{ids, ids, {}};
          },
          so);
      if (s >= warmup) v.seconds.push_back(clock.seconds());
    }
  std::vector<VariantSpeed> out;
  for (const auto& v : variants) {
    VariantSpeed r;
    r.name = v.name;
    r.plan = v.plan;
    r.step_seconds = median(v.seconds);
    r.tok_s = static_cast<double>(B * T) / r.step_seconds;
    r.gflops = r.tok_s * flops_per_token(v.cfg.model, T).total() / 1e9;
    out.push_back(r);
  }
  return out;
}

}  // namespace minimind
