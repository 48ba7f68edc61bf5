#include "minimind/run/routing_analysis.h"

#include <algorithm>
#include <numeric>

namespace minimind {

ProbeCounts::ProbeCounts(int64_t layers, int64_t experts, int64_t top_k, int64_t vocab,
                         std::vector<std::string> domains)
    : L_(layers), E_(experts), k_(top_k), V_(vocab), domains_(std::move(domains)) {
  if (domains_.empty()) domains_.push_back("probe");
  const auto L = static_cast<size_t>(L_), E = static_cast<size_t>(E_);
  counts = ExpertCounts::zeros(L, E);
  token_n_.assign(static_cast<size_t>(V_), 0);
  vocab_.assign(L, std::vector<int64_t>(static_cast<size_t>(V_) * E, 0));
  domain_tokens_.assign(domains_.size(), 0);
  domain_.assign(domains_.size(), std::vector<std::vector<int64_t>>(L, std::vector<int64_t>(E, 0)));
  coact_.assign(L, std::vector<int64_t>(E * E, 0));
  if (k_ == 1 && L > 1) flow_.assign(L - 1, std::vector<int64_t>(E * E, 0));
  repeat_sum_.assign(L, 0.0);
}

int64_t overlap(const int64_t* a, const int64_t* b, int64_t k) {
  int64_t n = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) n += a[i] == b[j];
  return n;
}

void ProbeCounts::add_sequence(size_t domain, const int64_t* ids, int64_t T,
                               const std::vector<const int64_t*>& choices) {
  const int64_t E = E_, k = k_;
  tokens_ += T;
  domain_tokens_.at(domain) += T;
  if (T > 1) repeat_pairs_ += T - 1;
  for (int64_t t = 0; t < T; ++t) ++token_n_.at(static_cast<size_t>(ids[t]));
  for (size_t l = 0; l < choices.size(); ++l) {
    const int64_t* K = choices[l];  // [T * k]
    std::vector<int64_t>& counts_l = counts.layers[l];
    std::vector<int64_t>& vocab_l = vocab_[l];
    std::vector<int64_t>& domain_l = domain_[domain][l];
    std::vector<int64_t>& coact_l = coact_[l];
    for (int64_t t = 0; t < T; ++t) {
      const int64_t* kt = K + t * k;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t a = kt[i];
        ++counts_l[a];
        ++vocab_l[ids[t] * E + a];
        ++domain_l[a];
        for (int64_t j = 0; j < k; ++j) ++coact_l[a * E + kt[j]];  // diagonal: tokens choosing a
      }
      if (t + 1 < T) repeat_sum_[l] += static_cast<double>(overlap(kt, kt + k, k)) / k;
      if (!flow_.empty() && l + 1 < choices.size()) ++flow_[l][kt[0] * E + choices[l + 1][t]];
    }
  }
}

RoutingAnalysis analyze_counts(const ProbeCounts& c,
                               const std::function<std::string(int64_t)>& piece,
                               size_t top_tokens) {
  RoutingAnalysis a;
  const int64_t L = c.L_, E = c.E_, k = c.k_, V = c.V_;
  a.layers = L, a.experts = E, a.top_k = k;
  a.uniform = static_cast<double>(k) / static_cast<double>(E);
  a.tokens = c.tokens_;
  a.domains = c.domains_;
  a.domain_tokens = c.domain_tokens_;
  for (int64_t l = 0; l < L; ++l) {
    const auto li = static_cast<size_t>(l);
    LayerAnalysis la;
    la.layer = l;
    la.router = c.counts.router_info(li);
    const RoutingMetrics m = routing_metrics(c.counts.layers[li]);
    la.experts.resize(static_cast<size_t>(E));
    std::vector<double> spec_sum(static_cast<size_t>(E), 0.0);
    double layer_sum = 0;
    // Vocabulary specialisation: e* = the expert most often chosen for v.
    const std::vector<int64_t>& vocab_l = c.vocab_[li];
    for (int64_t v = 0; v < V; ++v) {
      const int64_t n = c.token_n_[static_cast<size_t>(v)];
      if (n < kMinOccurrences) continue;
      const int64_t* row = vocab_l.data() + v * E;
      const int64_t best = std::max_element(row, row + E) - row;
      const double spec = static_cast<double>(row[best]) / static_cast<double>(n);
      layer_sum += spec;
      ++la.vocab_counted;
      spec_sum[static_cast<size_t>(best)] += spec;
      ++la.experts[static_cast<size_t>(best)].owned_tokens;
    }
    if (la.vocab_counted > 0) la.vocab_specialisation = layer_sum / la.vocab_counted;
    for (int64_t e = 0; e < E; ++e) {
      ExpertAnalysis& ex = la.experts[static_cast<size_t>(e)];
      ex.expert = e;
      ex.load = m.share.empty() ? 0.0 : m.share[static_cast<size_t>(e)];
      if (ex.owned_tokens > 0)
        ex.specialisation = spec_sum[static_cast<size_t>(e)] / ex.owned_tokens;
      // The tokens routed here most often.
      std::vector<int64_t> ids;
      for (int64_t v = 0; v < V; ++v)
        if (vocab_l[v * E + e] > 0) ids.push_back(v);
      const size_t n_top = std::min(top_tokens, ids.size());
      std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(n_top), ids.end(),
                        [&](int64_t x, int64_t y) {
                          const int64_t cx = vocab_l[x * E + e], cy = vocab_l[y * E + e];
                          return cx != cy ? cx > cy : x < y;
                        });
      for (size_t i = 0; i < n_top; ++i) {
        const int64_t v = ids[i], cnt = vocab_l[v * E + e];
        ex.top_tokens.push_back(
            {v, piece(v), cnt,
             static_cast<double>(cnt) / static_cast<double>(c.token_n_[static_cast<size_t>(v)])});
      }
      for (size_t d = 0; d < c.domains_.size(); ++d)
        ex.domain_share.push_back(
            c.domain_tokens_[d] > 0
                ? static_cast<double>(c.domain_[d][li][static_cast<size_t>(e)]) /
                      static_cast<double>(c.domain_tokens_[d])
                : 0.0);
    }
    // Repeat rate against chance: for independent choices with the layer's shares q_e,
    // E|K_t ∩ K_t+1| / k = k * sum_e q_e^2 (k = 1: sum q_e^2).
    if (c.repeat_pairs_ > 0) la.repeat_rate = c.repeat_sum_[li] / c.repeat_pairs_;
    for (double q : m.share) la.repeat_chance += static_cast<double>(k) * q * q;
    const std::vector<int64_t>& co = c.coact_[li];
    if (k >= 2) {
      la.coactivation.assign(static_cast<size_t>(E),
                             std::vector<double>(static_cast<size_t>(E), 0.0));
      for (int64_t x = 0; x < E; ++x)
        for (int64_t y = 0; y < E; ++y)
          if (co[x * E + x] > 0)
            la.coactivation[x][y] =
                static_cast<double>(co[x * E + y]) / static_cast<double>(co[x * E + x]);
    }
    if (!c.flow_.empty() && l + 1 < L) {
      const std::vector<int64_t>& f = c.flow_[li];
      la.flow.assign(static_cast<size_t>(E), std::vector<double>(static_cast<size_t>(E), 0.0));
      for (int64_t x = 0; x < E; ++x) {
        const int64_t row = std::accumulate(f.begin() + x * E, f.begin() + (x + 1) * E, int64_t{0});
        for (int64_t y = 0; y < E && row > 0; ++y)
          la.flow[x][y] = static_cast<double>(f[x * E + y]) / static_cast<double>(row);
      }
    }
    a.layer.push_back(std::move(la));
  }
  return a;
}

Saturation saturation(const std::vector<int64_t>& steps,
                      const std::vector<std::vector<std::vector<int64_t>>>& topk, int64_t k) {
  Saturation s;
  s.steps = steps;
  if (topk.empty()) return s;
  const auto& final_k = topk.back();
  const size_t L = final_k.size();
  const int64_t T = L > 0 ? static_cast<int64_t>(final_k[0].size()) / k : 0;
  s.tokens = T;
  // Mean over tokens of |a_t ∩ b_t| / k, per layer.
  auto agree = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) n += overlap(a.data() + t * k, b.data() + t * k, k);
    return T > 0 ? static_cast<double>(n) / static_cast<double>(T * k) : 0.0;
  };
  for (size_t ci = 0; ci < topk.size(); ++ci) {
    std::vector<double> per_layer;
    double sat = 0, flip = 0;
    for (size_t l = 0; l < L; ++l) {
      per_layer.push_back(agree(topk[ci][l], final_k[l]));
      sat += per_layer.back();
      if (ci > 0) flip += 1.0 - agree(topk[ci][l], topk[ci - 1][l]);
    }
    s.layer_saturation.push_back(per_layer);
    s.saturation.push_back(L > 0 ? sat / static_cast<double>(L) : 0.0);
    s.flip.push_back(L > 0 ? flip / static_cast<double>(L) : 0.0);
  }
  return s;
}

// JSON, written out field by field (std::optional becomes null). In namespace minimind, where
// nlohmann's calls find them by argument-dependent lookup.
using nlohmann::json;

void to_json(json& j, const TopToken& t) {
  j = {{"id", t.id}, {"text", t.text}, {"count", t.count}, {"share", t.share}};
}
void from_json(const json& j, TopToken& t) {
  j.at("id").get_to(t.id), j.at("text").get_to(t.text), j.at("count").get_to(t.count);
  j.at("share").get_to(t.share);
}
void to_json(json& j, const ExpertAnalysis& e) {
  j = {{"expert", e.expert},
       {"load", e.load},
       {"specialisation", e.specialisation},
       {"owned_tokens", e.owned_tokens},
       {"top_tokens", e.top_tokens},
       {"domain_share", e.domain_share}};
}
void from_json(const json& j, ExpertAnalysis& e) {
  j.at("expert").get_to(e.expert), j.at("load").get_to(e.load);
  j.at("specialisation").get_to(e.specialisation), j.at("owned_tokens").get_to(e.owned_tokens);
  j.at("top_tokens").get_to(e.top_tokens), j.at("domain_share").get_to(e.domain_share);
}
static json router_json(const RouterInfo& r) {
  if (r.tokens <= 0) return nullptr;
  return {{"token_entropy", r.token_entropy},
          {"marginal_entropy", r.marginal_entropy},
          {"mi", r.mi},
          {"confidence", r.confidence},
          {"tokens", r.tokens}};
}
static RouterInfo router_from(const json& j) {
  RouterInfo r;
  if (j.is_null()) return r;
  j.at("token_entropy").get_to(r.token_entropy),
      j.at("marginal_entropy").get_to(r.marginal_entropy);
  j.at("mi").get_to(r.mi), j.at("confidence").get_to(r.confidence), j.at("tokens").get_to(r.tokens);
  return r;
}
void to_json(json& j, const LayerAnalysis& l) {
  j = {{"layer", l.layer},
       {"router", router_json(l.router)},
       {"vocab_specialisation", l.vocab_specialisation},
       {"vocab_counted", l.vocab_counted},
       {"repeat_rate", l.repeat_rate},
       {"repeat_chance", l.repeat_chance},
       {"experts", l.experts},
       {"coactivation", l.coactivation},
       {"flow", l.flow}};
}
void from_json(const json& j, LayerAnalysis& l) {
  j.at("layer").get_to(l.layer);
  l.router = router_from(j.at("router"));
  j.at("vocab_specialisation").get_to(l.vocab_specialisation);
  j.at("vocab_counted").get_to(l.vocab_counted), j.at("repeat_rate").get_to(l.repeat_rate);
  j.at("repeat_chance").get_to(l.repeat_chance), j.at("experts").get_to(l.experts);
  j.at("coactivation").get_to(l.coactivation), j.at("flow").get_to(l.flow);
}
void to_json(json& j, const Saturation& s) {
  j = {{"steps", s.steps},
       {"saturation", s.saturation},
       {"flip", s.flip},
       {"layer_saturation", s.layer_saturation},
       {"tokens", s.tokens}};
}
void from_json(const json& j, Saturation& s) {
  j.at("steps").get_to(s.steps), j.at("saturation").get_to(s.saturation);
  j.at("flip").get_to(s.flip), j.at("layer_saturation").get_to(s.layer_saturation);
  j.at("tokens").get_to(s.tokens);
}
void to_json(json& j, const TokenView& v) {
  j = {{"pieces", v.pieces}, {"top1", v.top1}, {"probs", v.probs}};
}
void from_json(const json& j, TokenView& v) {
  j.at("pieces").get_to(v.pieces), j.at("top1").get_to(v.top1), j.at("probs").get_to(v.probs);
}

void to_json(json& j, const RoutingAnalysis& a) {
  j = {{"weights", a.weights},
       {"step", a.step},
       {"layers", a.layers},
       {"experts", a.experts},
       {"top_k", a.top_k},
       {"uniform", a.uniform},
       {"tokens", a.tokens},
       {"documents", a.documents},
       {"domains", a.domains},
       {"domain_tokens", a.domain_tokens},
       {"layer", a.layer},
       {"saturation", a.saturation},
       {"saturation_note", a.saturation_note},
       {"passages", a.passages}};
}

void from_json(const json& j, RoutingAnalysis& a) {
  j.at("weights").get_to(a.weights), j.at("step").get_to(a.step);
  j.at("layers").get_to(a.layers), j.at("experts").get_to(a.experts);
  j.at("top_k").get_to(a.top_k), j.at("uniform").get_to(a.uniform);
  j.at("tokens").get_to(a.tokens), j.at("documents").get_to(a.documents);
  j.at("domains").get_to(a.domains), j.at("domain_tokens").get_to(a.domain_tokens);
  j.at("layer").get_to(a.layer), j.at("saturation").get_to(a.saturation);
  j.at("saturation_note").get_to(a.saturation_note), j.at("passages").get_to(a.passages);
}

}  // namespace minimind
