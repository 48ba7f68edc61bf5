// What did the experts learn? The analyses of docs/moe-routing.md ("What did the experts
// learn?") on a probe set: ProbeCounts adds up, sequence by sequence, what the router chose
// for each token (bounded memory: counts only, whatever the corpus size), and
// analyze_counts() turns the sums into a RoutingAnalysis, which is also the JSON that
// minimind-eval --analyze --json prints and report.html reads (analysis.json).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "minimind/run/expert_counts.h"
#include "minimind/run/routing_metrics.h"

NLOHMANN_JSON_NAMESPACE_BEGIN
// std::optional as JSON: null when unset.
template <class T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& o) {
    if (o) {
      j = *o;
    } else {
      j = nullptr;
    }
  }
  static void from_json(const json& j, std::optional<T>& o) {
    if (j.is_null()) {
      o.reset();
    } else {
      o = j.get<T>();
    }
  }
};
NLOHMANN_JSON_NAMESPACE_END

namespace minimind {

struct RoutingAnalysis;

// A token id must occur this often for its specialisation to count (OLMoE's rule).
constexpr int64_t kMinOccurrences = 10;

// The sums of one model over a probe set.
class ProbeCounts {
 public:
  // layers: MoE layers; vocab: token ids are < vocab; domains: names of the probe corpora.
  ProbeCounts(int64_t layers, int64_t experts, int64_t top_k, int64_t vocab,
              std::vector<std::string> domains);

  // One sequence of T real tokens (no padding) of domain d: ids [T], and per MoE layer its
  // choices [T * k] (token-major). Counts, vocabulary, domain, co-activation, layer flow
  // (k = 1) and the repeat rate between consecutive tokens.
  void add_sequence(size_t domain, const int64_t* ids, int64_t T,
                    const std::vector<const int64_t*>& choices);

  int64_t layers() const { return L_; }
  int64_t experts() const { return E_; }
  int64_t top_k() const { return k_; }
  int64_t vocab() const { return V_; }
  int64_t tokens() const { return tokens_; }
  const std::vector<std::string>& domains() const { return domains_; }

  ExpertCounts counts;  // per layer; the caller adds the router sums (ExpertCounts::add_router)

 private:
  friend RoutingAnalysis analyze_counts(const ProbeCounts&,
                                        const std::function<std::string(int64_t)>&, size_t);
  int64_t L_, E_, k_, V_;
  std::vector<std::string> domains_;
  int64_t tokens_ = 0;
  std::vector<int64_t> token_n_;                           // [V] occurrences
  std::vector<std::vector<int64_t>> vocab_;                // [L][V * E] occurrences with e chosen
  std::vector<int64_t> domain_tokens_;                     // [D]
  std::vector<std::vector<std::vector<int64_t>>> domain_;  // [D][L][E]
  std::vector<std::vector<int64_t>> coact_;                // [L][E * E] tokens choosing a and b
  std::vector<std::vector<int64_t>> flow_;                 // [L - 1][E * E] top-1 a -> b (k = 1)
  std::vector<double> repeat_sum_;                         // [L] sum of |K_t ∩ K_t+1| / k
  int64_t repeat_pairs_ = 0;                               // consecutive pairs seen
};

struct TopToken {
  int64_t id = 0;
  std::string text;   // the piece, readable
  int64_t count = 0;  // occurrences of the token routed to this expert
  double share = 0;   // count / all occurrences of the token
};

struct ExpertAnalysis {
  int64_t expert = 0;
  double load = 0;                       // share of the layer's assignments
  std::optional<double> specialisation;  // mean spec(v) over the v whose e* is this expert
  int64_t owned_tokens = 0;              // how many such v (0: specialisation unset)
  std::vector<TopToken> top_tokens;      // most frequent tokens routed here
  std::vector<double> domain_share;      // [D]: share of each domain's tokens choosing it
};

struct LayerAnalysis {
  int64_t layer = 0;
  RouterInfo router;                           // H̄, H_m, MI, confidence (learned routers)
  std::optional<double> vocab_specialisation;  // mean spec(v) over v with n_v >= 10
  int64_t vocab_counted = 0;                   // how many v had enough occurrences
  double repeat_rate = 0, repeat_chance = 0;   // consecutive tokens; chance k * sum q_e^2
  std::vector<ExpertAnalysis> experts;
  std::vector<std::vector<double>> coactivation;  // [E][E] P(b | a) (k >= 2; else empty)
  std::vector<std::vector<double>> flow;          // [E][E] to the next layer (k = 1; else empty)
};

// Router saturation (OLMoE) and flip rate (StableMoE) over a run's kept checkpoints, on the
// same probe tokens: sat(s) = mean_t |K_s ∩ K_final| / k, flip(s) = 1 - overlap with the
// checkpoint before; averaged over layers, and per layer.
struct Saturation {
  std::vector<int64_t> steps;
  std::vector<double> saturation, flip;               // flip[0] = 0 (no checkpoint before)
  std::vector<std::vector<double>> layer_saturation;  // [checkpoint][layer]
  int64_t tokens = 0;                                 // probe tokens compared
};

// A few passages, each token with its top-1 expert per layer and the router's
// probabilities (Mixtral's token colouring).
struct TokenView {
  std::vector<std::string> pieces;                      // [T] readable pieces
  std::vector<std::vector<int64_t>> top1;               // [L][T]
  std::vector<std::vector<std::vector<double>>> probs;  // [L][T][E]; empty without a learned router
};

struct RoutingAnalysis {
  std::string weights;  // the checkpoint analysed
  int64_t step = 0;
  int64_t layers = 0, experts = 0, top_k = 0;
  double uniform = 0;  // k / E: what a router that ignores the token gives
  int64_t tokens = 0, documents = 0;
  std::vector<std::string> domains;
  std::vector<int64_t> domain_tokens;
  std::vector<LayerAnalysis> layer;
  std::optional<Saturation> saturation;
  std::string saturation_note;  // why there is none, or how to get more points
  std::vector<TokenView> passages;
};

// The analysis of the sums. piece(id): the readable text of a token id.
RoutingAnalysis analyze_counts(const ProbeCounts& c,
                               const std::function<std::string(int64_t)>& piece,
                               size_t top_tokens = 12);

// Saturation from the choices of each checkpoint on the same tokens: topk[c][l] is
// [T * k] for checkpoint c (oldest first; the last is the final model).
Saturation saturation(const std::vector<int64_t>& steps,
                      const std::vector<std::vector<std::vector<int64_t>>>& topk, int64_t k);

// |a ∩ b| of two choice sets of k experts.
int64_t overlap(const int64_t* a, const int64_t* b, int64_t k);

void to_json(nlohmann::json& j, const RoutingAnalysis& a);
void from_json(const nlohmann::json& j, RoutingAnalysis& a);

}  // namespace minimind
