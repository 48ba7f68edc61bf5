#include "minimind/run/expert_counts.h"

#include <torch/torch.h>

#include "minimind/dist/distributed.h"

namespace minimind {

ExpertCounts ExpertCounts::zeros(size_t num_layers, size_t num_experts, bool router) {
  ExpertCounts c;
  c.layers.assign(num_layers, std::vector<int64_t>(num_experts, 0));
  if (router) c.router.assign(num_layers, RouterSums(num_experts + 3, 0.0));
  return c;
}

void ExpertCounts::add(const std::vector<torch::Tensor>& per_layer) {
  if (layers.size() < per_layer.size()) layers.resize(per_layer.size());
  for (size_t l = 0; l < per_layer.size(); ++l) {
    const torch::Tensor c = per_layer[l].contiguous();  // [E] int64
    const int64_t* v = c.data_ptr<int64_t>();
    add_counts(layers[l], std::vector<int64_t>(v, v + c.numel()));
  }
}

void ExpertCounts::add_router(const std::vector<torch::Tensor>& per_layer) {
  if (router.size() < per_layer.size()) router.resize(per_layer.size());
  for (size_t l = 0; l < per_layer.size(); ++l) {
    const torch::Tensor s = per_layer[l].to(torch::kFloat64).contiguous();  // [E + 3]
    const double* v = s.data_ptr<double>();
    add_sums(router[l], std::vector<double>(v, v + s.numel()));
  }
}

void ExpertCounts::add(const ExpertCounts& other) {
  if (layers.size() < other.layers.size()) layers.resize(other.layers.size());
  for (size_t l = 0; l < other.layers.size(); ++l) add_counts(layers[l], other.layers[l]);
  if (router.size() < other.router.size()) router.resize(other.router.size());
  for (size_t l = 0; l < other.router.size(); ++l) add_sums(router[l], other.router[l]);
}

void sum_over_ranks(ExpertCounts& counts, std::vector<int64_t>& totals, Distributed& dist) {
  if (dist.world_size() == 1) return;
  // One flat buffer: totals, then every layer's counts.
  std::vector<int64_t> flat = totals;
  for (const auto& layer : counts.layers) flat.insert(flat.end(), layer.begin(), layer.end());
  dist.all_reduce_sum(flat);
  auto next = flat.begin();
  for (auto& t : totals) t = *next++;
  for (auto& layer : counts.layers)
    for (auto& c : layer) c = *next++;
  if (counts.router.empty()) return;  // learned routers on every rank, or on none
  std::vector<double> sums;
  for (const auto& layer : counts.router) sums.insert(sums.end(), layer.begin(), layer.end());
  dist.all_reduce_sum(sums);
  auto at = sums.begin();
  for (auto& layer : counts.router)
    for (auto& v : layer) v = *at++;
}

}  // namespace minimind
