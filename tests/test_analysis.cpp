// Routing analysis with answers known in advance: hand-set routers whose choices can be
// written down (token ids below V/2 to one expert, the rest to another), a router that
// ignores the token, a checkpoint compared with itself, and the errors of --analyze.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>

#include "minimind/eval/analyze.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/routing_analysis.h"
#include "support/test_support.h"

using namespace minimind;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kVocab = 32;

// A MoE whose layers only route: attention and experts output 0, so every layer sees the
// embedding. Token v's embedding is +1 (v < V/2) or -1 in dimension 0; the router's logit
// for expert e is slopes[e] times that (after RMSNorm: +-sqrt(H)).
EvalModel hand_set_model(int64_t experts, int64_t k, const std::vector<double>& slopes,
                         const std::string& router = "learned") {
  EvalModel m;
  m.config = load_config_string(
      "model: {hidden_size: 16, num_hidden_layers: 3, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 32, max_position_embeddings: 64,\n"
      "        use_moe: true, router_aux_loss_coef: 0.0}\n"
      "data: {max_seq_len: 63}\n",
      "hand.yaml");
  apply_override(m.config, "model.num_experts=" + std::to_string(experts));
  apply_override(m.config, "model.num_experts_per_tok=" + std::to_string(k));
  apply_override(m.config, "model.router=" + router);
  validate_and_resolve(m.config);
  m.model = MiniMindForCausalLM(m.config.model);
  torch::NoGradGuard no_grad;
  for (auto& p : m.model->named_parameters()) {
    const std::string& n = p.key();
    p.value().zero_();
    if (n.find("norm.weight") != std::string::npos) p.value().fill_(1.0);
  }
  torch::Tensor embed = m.model->model->embed_tokens->weight;  // [V, H]
  embed.narrow(0, 0, kVocab / 2).select(1, 0).fill_(1.0);
  embed.narrow(0, kVocab / 2, kVocab / 2).select(1, 0).fill_(-1.0);
  for (const torch::Tensor& gate : m.model->router_weights())  // [E, H]
    for (int64_t e = 0; e < experts; ++e) gate[e][0] = slopes[static_cast<size_t>(e)];
  m.weights = "hand-set";
  m.step = 100;
  return m;
}

// Documents of random token ids in [3, V) (0-2 are the special ids).
std::string probe_tokens(const std::string& dir, int64_t docs, int64_t len, uint32_t seed = 3) {
  const std::string path = dir + "/probe.tok";
  TokenFileWriter w(path, kVocab, {seed, 0});
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(3, kVocab - 1);
  for (int64_t d = 0; d < docs; ++d) {
    std::vector<int32_t> doc;
    for (int64_t t = 0; t < len; ++t) doc.push_back(id(gen));
    w.add_document(doc);
  }
  w.finish();
  return path;
}

RoutingAnalysis analyze(EvalModel& m, const TokenFile& probe) {
  AnalyzeOptions o;
  o.sources.push_back({"probe", "", &probe});
  return analyze_routing(m, o);
}

// What the hand-set split predicts for a probe: shares, repeat rate and chance.
struct Split {
  double low_share = 0, repeat = 0;
};
Split split_of(const TokenFile& tf) {
  int64_t low = 0, n = 0, same = 0, pairs = 0;
  for (uint64_t d = 0; d < tf.num_docs(); ++d) {
    for (uint64_t i = 0; i < tf.doc_length(d); ++i) {
      const bool lo = tf.token(tf.doc_start(d) + i) < kVocab / 2;
      low += lo, ++n;
      if (i > 0) same += lo == (tf.token(tf.doc_start(d) + i - 1) < kVocab / 2), ++pairs;
    }
  }
  return {static_cast<double>(low) / n, static_cast<double>(same) / pairs};
}

}  // namespace

// Top-1 over 2 experts: low ids -> e0, high ids -> e1 in every layer.
TEST(AnalysisKnownAnswers, HalfVocabularyRouterTop1) {
  const std::string dir = test::temp_dir("analysis_top1");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 40, 60));
  EvalModel m = hand_set_model(2, 1, {1.0, -1.0});
  const RoutingAnalysis a = analyze(m, probe);
  const Split s = split_of(probe);
  ASSERT_EQ(a.layer.size(), 3u);
  for (const LayerAnalysis& l : a.layer) {
    ASSERT_TRUE(l.vocab_specialisation);
    EXPECT_DOUBLE_EQ(*l.vocab_specialisation, 1.0);
    EXPECT_DOUBLE_EQ(*l.experts[0].specialisation, 1.0);
    EXPECT_DOUBLE_EQ(*l.experts[1].specialisation, 1.0);
    EXPECT_NEAR(l.experts[0].load, s.low_share, 1e-12);
    // Every top token of e0 is a low id, with all of its occurrences there.
    for (const TopToken& t : l.experts[0].top_tokens) {
      EXPECT_LT(t.id, kVocab / 2);
      EXPECT_DOUBLE_EQ(t.share, 1.0);
    }
    // Repeat rate: consecutive tokens on the same side; chance q0^2 + q1^2.
    EXPECT_NEAR(l.repeat_rate, s.repeat, 1e-12);
    EXPECT_NEAR(l.repeat_chance, s.low_share * s.low_share + (1 - s.low_share) * (1 - s.low_share),
                1e-12);
    EXPECT_TRUE(l.coactivation.empty());  // k = 1
    // The router is sure and informative: p = softmax(+-4, -+4) per side.
    const double p = 1.0 / (1.0 + std::exp(-8.0));
    EXPECT_NEAR(l.router.confidence, p, 1e-6);
    EXPECT_NEAR(l.router.token_entropy,
                -(p * std::log(p) + (1 - p) * std::log(1 - p)) / std::log(2.0), 1e-5);
    EXPECT_GT(l.router.mi, 0.9);
  }
  // Flow: e0 stays e0, e1 stays e1.
  for (size_t l = 0; l + 1 < a.layer.size(); ++l)
    EXPECT_EQ(a.layer[l].flow, (std::vector<std::vector<double>>{{1.0, 0.0}, {0.0, 1.0}}));
  EXPECT_TRUE(a.layer.back().flow.empty());
}

// Top-2 over 4 experts: low ids choose {e0, e1}, high ids {e2, e3}.
TEST(AnalysisKnownAnswers, HalfVocabularyRouterTop2CoActivation) {
  const std::string dir = test::temp_dir("analysis_top2");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 40, 60));
  EvalModel m = hand_set_model(4, 2, {2.0, 1.0, -1.0, -2.0});
  const RoutingAnalysis a = analyze(m, probe);
  const std::vector<std::vector<double>> pairs{
      {1, 1, 0, 0}, {1, 1, 0, 0}, {0, 0, 1, 1}, {0, 0, 1, 1}};
  for (const LayerAnalysis& l : a.layer) {
    EXPECT_EQ(l.coactivation, pairs);
    // e0 and e1 both get every occurrence of a low id: specialisation 1.0 for the layer.
    EXPECT_DOUBLE_EQ(*l.vocab_specialisation, 1.0);
    EXPECT_NEAR(l.repeat_rate, split_of(probe).repeat, 1e-12);
    EXPECT_TRUE(l.flow.empty());  // k = 2
  }
  EXPECT_EQ(a.uniform, 0.5);
}

// A router with all-zero weights gives every token the same (uniform) probabilities: MI 0,
// token entropy 1, confidence k/E.
TEST(AnalysisKnownAnswers, UniformRouterHasNoInformation) {
  const std::string dir = test::temp_dir("analysis_uniform");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 20, 60));
  EvalModel m = hand_set_model(4, 2, {0, 0, 0, 0});
  for (const LayerAnalysis& l : analyze(m, probe).layer) {
    EXPECT_NEAR(l.router.mi, 0.0, 1e-12);
    EXPECT_NEAR(l.router.token_entropy, 1.0, 1e-12);
    EXPECT_NEAR(l.router.marginal_entropy, 1.0, 1e-12);
    EXPECT_NEAR(l.router.confidence, 0.5, 1e-12);
  }
}

// A router that ignores the token (the lab's random router): specialisation ~ k/E. With
// ~2,000 occurrences per token id the favourite expert's share is 1/4 + ~0.02.
TEST(AnalysisKnownAnswers, RandomRouterSpecialisationIsNearKOverE) {
  const std::string dir = test::temp_dir("analysis_random");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 1000, 60));
  EvalModel m = hand_set_model(4, 1, {0, 0, 0, 0}, "random");
  torch::manual_seed(1);
  const RoutingAnalysis a = analyze(m, probe);
  for (const LayerAnalysis& l : a.layer) {
    ASSERT_TRUE(l.vocab_specialisation);
    EXPECT_NEAR(*l.vocab_specialisation, 0.25, 0.03);
    EXPECT_NEAR(l.repeat_rate, l.repeat_chance, 0.01);
    EXPECT_EQ(l.router.tokens, 0);  // no learned router: no probabilities
  }
}

// Saturation of a checkpoint against itself is 1 and nothing flips; with earlier weights
// that route the other way round, nothing agrees.
TEST(AnalysisKnownAnswers, SaturationOfACheckpointWithItself) {
  const std::string dir = test::temp_dir("analysis_saturation");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 20, 40));
  EvalModel m = hand_set_model(2, 1, {1.0, -1.0});
  EvalModel flipped = hand_set_model(2, 1, {-1.0, 1.0});
  for (const char* step : {"step_00000050", "step_00000080", "step_00000020"}) {
    fs::create_directories(dir + "/" + step);
    save_weights(std::string(step) == "step_00000020" ? flipped.model : m.model,
                 dir + "/" + step + "/model.pth");
  }
  AnalyzeOptions o;
  o.sources.push_back({"probe", "", &probe});
  o.checkpoints = {
      {20, dir + "/step_00000020"}, {50, dir + "/step_00000050"}, {80, dir + "/step_00000080"}};
  const RoutingAnalysis a = analyze_routing(m, o);
  ASSERT_TRUE(a.saturation);
  EXPECT_EQ(a.saturation->steps, (std::vector<int64_t>{20, 50, 80, 100}));
  EXPECT_EQ(a.saturation->saturation, (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(a.saturation->flip, (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(a.saturation_note, "");
  // Fewer than 4 points: the note says how to keep more checkpoints.
  o.checkpoints = {{50, dir + "/step_00000050"}};
  o.keep_checkpoints = 2;
  const RoutingAnalysis b = analyze_routing(m, o);
  EXPECT_EQ(b.saturation->saturation, (std::vector<double>{1, 1}));
  EXPECT_NE(b.saturation_note.find("raise train.keep_checkpoints (now 2)"), std::string::npos)
      << b.saturation_note;
}

TEST(AnalysisErrors, DenseModelShortProbeAndEmptyProbe) {
  const std::string dir = test::temp_dir("analysis_errors");
  EvalModel dense = hand_set_model(2, 1, {1.0, -1.0});
  apply_override(dense.config, "model.use_moe=false");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 2, 30));
  EXPECT_NE(test::error_of<ConfigError>([&] { analyze(dense, probe); }).find("nothing to analyse"),
            std::string::npos);
  // Fewer than 10 occurrences of every id: specialisation unset ("too few"), not 0.
  EvalModel m = hand_set_model(2, 1, {1.0, -1.0});
  const RoutingAnalysis a = analyze(m, probe);  // 60 tokens over 29 ids
  for (const LayerAnalysis& l : a.layer) {
    EXPECT_FALSE(l.vocab_specialisation);
    EXPECT_EQ(l.vocab_counted, 0);
  }
  EXPECT_TRUE(nlohmann::json(a)["layer"][0]["vocab_specialisation"].is_null());
  // A document of one token (no [bos] and [eos] around a text): the file is refused when
  // opened, named, before anything reads past the document's end.
  const std::string one = dir + "/one.tok";
  {
    TokenFileWriter w(one, kVocab, {9, 9});
    w.add_document({5});
    w.finish();
  }
  const std::string err = test::error_of<DataError>([&] { TokenFile::open(one); });
  EXPECT_NE(err.find(one + "' has a corrupted document table"), std::string::npos) << err;
}

// The JSON form reads back to the same analysis (report.html reads analysis.json).
TEST(AnalysisJson, RoundTrips) {
  const std::string dir = test::temp_dir("analysis_json");
  const TokenFile probe = TokenFile::open(probe_tokens(dir, 20, 60));
  EvalModel m = hand_set_model(4, 2, {2.0, 1.0, -1.0, -2.0});
  const RoutingAnalysis a = analyze(m, probe);
  const nlohmann::json j = a;
  const RoutingAnalysis b = j.get<RoutingAnalysis>();
  EXPECT_EQ(nlohmann::json(b), j);
  EXPECT_EQ(b.passages.size(), 3u);
  EXPECT_EQ(b.passages[0].top1.size(), 3u);  // one row per layer
}
