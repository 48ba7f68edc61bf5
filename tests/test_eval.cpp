// minimind-eval and inspection: evaluation semantics, the JSON output, bad checkpoints,
// KV-cache generation, the terminal inspection and the HTML report.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "minimind/analysis/charts.h"
#include "minimind/analysis/compare.h"
#include "minimind/analysis/inspect.h"
#include "minimind/analysis/report.h"
#include "minimind/config.h"
#include "minimind/data/prepare.h"
#include "minimind/data/token_file.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/eval/evaluate.h"
#include "minimind/eval/generate.h"
#include "minimind/model/weights_io.h"
#include "minimind/train/report_writer.h"
#include "minimind/train/trainer.h"
#include "minimind/util/allocator.h"
#include "support/test_support.h"

using namespace minimind;
namespace fs = std::filesystem;

namespace {

using test::Command;

Command run(const std::string& args) {
  return test::run_command(std::string(MINIMIND_EVAL_BIN) + " " + args);
}

// One tiny trained MoE run (and a dense one) shared by the suite.
class EvalTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("eval"));
    for (bool moe : {true, false}) {
      const Config cfg = test::tiny_config(
          *dir_,
          {"model.use_moe=" + std::string(moe ? "true" : "false"), "model.num_experts_per_tok=1",
           "data.max_seq_len=48", "train.accumulation_steps=1", "train.max_steps=12",
           "train.eval_interval=6", "train.checkpoint_interval=6", "train.keep_checkpoints=3"});
      ReportWriter report;  // as minimind-train does
      TrainOptions options;
      options.out_dir = *dir_ + (moe ? "/moe" : "/dense");
      options.observers.push_back(&report);
      train(cfg, options);
      if (moe) config_ = new Config(cfg);
    }
    // A balancing-lab run: every method that leaves its own traces in the logs and weights.
    const Config lab = test::tiny_config(
        *dir_, {"model.num_experts_per_tok=1", "model.norm_topk_prob=false",
                "model.scoring_func=sigmoid", "model.router_bias_update_rate=0.01",
                "model.router_z_loss_coef=0.001", "model.capacity_factor=1.0",
                "model.n_shared_experts=1", "data.max_seq_len=48", "train.accumulation_steps=1",
                "train.max_steps=12", "train.eval_interval=6", "train.checkpoint_interval=6"});
    ReportWriter report;
    TrainOptions options;
    options.out_dir = *dir_ + "/lab";
    options.observers.push_back(&report);
    train(lab, options);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete config_;
  }
  static std::string ckpt() { return *dir_ + "/moe/checkpoints/step_00000012"; }
  static std::string* dir_;
  static Config* config_;
};
std::string* EvalTest::dir_ = nullptr;
Config* EvalTest::config_ = nullptr;

}  // namespace

TEST_F(EvalTest, JsonOutputSchema) {
  Command c = run("loss " + ckpt() + " --json --max-docs 6");
  ASSERT_EQ(c.status, 0) << c.err;
  // stdout is exactly one JSON object, an EvalSummary (reading it checks every field).
  const EvalSummary j = nlohmann::json::parse(c.out).get<EvalSummary>();
  // The same numbers as evaluating in process.
  EvalModel m = load_eval_model(ckpt(), "", "", false);
  const PreparedData data = prepare_data(m.config.data, m.config.model.vocab_size, 1);
  const EvalResult direct = evaluate(m.model, TokenFile::open(data.val_path), 48, 4, 6);
  EXPECT_EQ(j.documents, 6);
  EXPECT_EQ(j.tokens, direct.tokens);
  EXPECT_NEAR(j.loss, direct.loss, 1e-5);  // other thread counts: other summation order
  EXPECT_NEAR(j.ppl, std::exp(j.loss), 1e-9 * j.ppl);
  EXPECT_EQ(j.weights, ckpt() + "/model.pth");
  ASSERT_EQ(j.expert_load.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    const LoadRecord& layer = j.expert_load[l];
    EXPECT_EQ(layer.layer, static_cast<int64_t>(l));
    EXPECT_EQ(layer.step, 12);  // the checkpoint's
    EXPECT_EQ(layer.counts, direct.expert_counts.layers[l]);
    const RoutingMetrics rm = routing_metrics(layer.counts);
    EXPECT_DOUBLE_EQ(layer.max_vio, rm.max_vio);
    EXPECT_DOUBLE_EQ(layer.entropy, rm.entropy);
    EXPECT_EQ(layer.dead, static_cast<int64_t>(rm.dead.size()));
  }
  EXPECT_NE(c.err.find("loss"), std::string::npos);  // human output went to stderr
}

TEST_F(EvalTest, AnyCorpusAndRunDirectory) {
  std::ofstream(*dir_ + "/other.jsonl") << "{\"text\": \"Emma was not quite sure.\"}\n"
                                        << "{\"text\": \"中文也可以。🙂\"}\n";
  Command c = run("loss " + *dir_ + "/moe --data " + *dir_ + "/other.jsonl --json");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(nlohmann::json::parse(c.out)["documents"], 2);
}

TEST_F(EvalTest, BatchSizeDoesNotChangeTheLossAndEvalLeavesTrainingStateAlone) {
  EvalModel m = load_eval_model(ckpt(), "", "", true);
  TokenFile docs = tokenize_corpus(*dir_ + "/corpus.jsonl", *m.tokenizer, *dir_ + "/tok_bs", 20);
  m.model->train();
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : m.model->named_parameters()) before[p.key()] = p.value().clone();
  EvalResult a = evaluate(m.model, docs, 48, 1), b = evaluate(m.model, docs, 48, 7);
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.expert_counts, b.expert_counts);
  ASSERT_EQ(a.expert_counts.router.size(), 2u);  // the router's probabilities, real tokens only
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_NEAR(a.expert_counts.router_info(l).mi, b.expert_counts.router_info(l).mi, 1e-9);
    EXPECT_EQ(a.expert_counts.router_info(l).tokens, b.expert_counts.router_info(l).tokens);
  }
  EXPECT_TRUE(m.model->is_training());
  for (const auto& p : m.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), before[p.key()])) << p.key();
    EXPECT_FALSE(p.value().grad().defined()) << p.key();
  }
}

// A document longer than data.max_seq_len is predicted whole, in windows that overlap by
// one token; --truncate keeps MiniMind's first window. Checked against a hand computation:
// each window through the model on its own, its cross-entropy summed by hand.
TEST_F(EvalTest, LongDocumentsArePredictedWholeInWindows) {
  EvalModel m = load_eval_model(ckpt(), "", "", true);
  const int64_t S = 48, V = m.config.model.vocab_size;
  const std::vector<int64_t> lengths = {130, 20, 48, 49};  // [bos] ... [eos] each
  const std::string path = test::temp_dir("eval_windows") + "/docs.tok";
  std::vector<std::vector<int32_t>> docs;
  {
    TokenFileWriter w(path, static_cast<uint32_t>(V), {0, 0});
    for (size_t d = 0; d < lengths.size(); ++d) {
      std::vector<int32_t> doc{SpecialIds{}.bos};
      for (int64_t t = 1; t + 1 < lengths[d]; ++t)
        doc.push_back(static_cast<int32_t>(3 + (t * 37 + static_cast<int64_t>(d) * 11) % (V - 3)));
      doc.push_back(SpecialIds{}.eos);
      w.add_document(doc);
      docs.push_back(doc);
    }
    w.finish();
  }
  const TokenFile tf = TokenFile::open(path);
  // By hand: windows start at 0, S-1, 2(S-1), ... while a token is left to predict.
  double sum = 0;
  int64_t predicted = 0, windows = 0;
  torch::NoGradGuard no_grad;
  m.model->eval();
  for (const auto& doc : docs) {
    const auto len = static_cast<int64_t>(doc.size());
    for (int64_t at = 0; at < len - 1; at += S - 1, ++windows) {
      const int64_t n = std::min(S, len - at);
      torch::Tensor ids = torch::empty({1, n}, torch::kLong);
      for (int64_t t = 0; t < n; ++t) ids[0][t] = doc[static_cast<size_t>(at + t)];
      const torch::Tensor logp = torch::log_softmax(m.model(ids).logits[0], -1);  // [n, V]
      for (int64_t t = 0; t + 1 < n; ++t, ++predicted)
        sum -= logp[t][ids[0][t + 1].item<int64_t>()].item<double>();
    }
  }
  EXPECT_EQ(windows, 3 + 1 + 1 + 2);
  const EvalResult r = evaluate(m.model, tf, S, 3);
  EXPECT_EQ(r.tokens, 129 + 19 + 47 + 48);  // every token but each bos
  EXPECT_EQ(r.tokens, predicted);
  EXPECT_EQ(r.corpus_tokens, r.tokens);
  EXPECT_EQ(r.rows, windows);
  EXPECT_EQ(r.documents, 4);
  EXPECT_NEAR(r.loss, sum / static_cast<double>(predicted), 1e-5);
  // Every token is routed once: the expert counts add up to the predicted tokens + the
  // first token of each window, k = 1.
  for (const auto& layer : r.expert_counts.layers)
    EXPECT_EQ(std::accumulate(layer.begin(), layer.end(), int64_t{0}), r.tokens + r.rows);
  // MiniMind's rule: the first window, [eos] at its end; documents that fit are unchanged.
  const EvalResult cut = evaluate(m.model, tf, S, 3, -1, LongDocuments::truncate);
  EXPECT_EQ(cut.tokens, (S - 1) + 19 + 47 + (S - 1));
  EXPECT_EQ(cut.corpus_tokens, r.corpus_tokens);
  EXPECT_EQ(cut.rows, 4);
  // The tool says both counts, and what --truncate left out.
  const Command c = run("loss " + ckpt() + " --json --truncate");
  ASSERT_EQ(c.status, 0) << c.err;
  const EvalSummary j = nlohmann::json::parse(c.out).get<EvalSummary>();
  ASSERT_TRUE(j.corpus_tokens && j.corpus_documents && j.truncated);
  EXPECT_LE(j.tokens, *j.corpus_tokens);
  EXPECT_TRUE(*j.truncated);
  const Command whole = run("loss " + ckpt() + " --json");
  const EvalSummary w = nlohmann::json::parse(whole.out).get<EvalSummary>();
  EXPECT_EQ(w.tokens, *w.corpus_tokens);
  EXPECT_NE(whole.err.find(fmt::format("{} of {} tokens predicted", w.tokens, w.tokens)),
            std::string::npos)
      << whole.err;
}

TEST_F(EvalTest, BadCheckpointsAreClearErrors) {
  Command missing = run("loss " + *dir_ + "/nope");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("does not exist"), std::string::npos) << missing.err;

  // A truncated model.pth.
  fs::copy(ckpt(), *dir_ + "/broken", fs::copy_options::recursive);
  fs::resize_file(*dir_ + "/broken/model.pth", 1000);
  Command corrupt = run("loss " + *dir_ + "/broken --tokenizer " + *dir_ + "/moe/tokenizer.model");
  EXPECT_NE(corrupt.status, 0);
  EXPECT_NE(corrupt.err.find("model.pth' is damaged: not a zip archive: no "
                             "end-of-central-directory record (truncated?)"),
            std::string::npos)
      << corrupt.err;

  // A bare .pth: needs --config, and its names/shapes must match it.
  Command no_config = run(ckpt() + "/model.pth");
  EXPECT_NE(no_config.status, 0);
  EXPECT_NE(no_config.err.find("pass --config"), std::string::npos) << no_config.err;
  std::ofstream(*dir_ + "/wrong.yaml")
      << "model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 2,"
         " num_key_value_heads: 1, vocab_size: 512, use_moe: true}\n"
         "data: {max_seq_len: 48}\n";
  Command mismatch = run("loss " + ckpt() + "/model.pth --config " + *dir_ + "/wrong.yaml");
  EXPECT_NE(mismatch.status, 0);
  EXPECT_NE(mismatch.err.find("do not match the model config"), std::string::npos) << mismatch.err;
  EXPECT_NE(mismatch.err.find("shape of model.embed_tokens.weight"), std::string::npos)
      << mismatch.err;

  // A tokenizer whose vocabulary disagrees with the model.
  std::ofstream(*dir_ + "/v600.yaml")
      << "model: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,"
         " num_key_value_heads: 1, vocab_size: 600}\n"
         "data: {train: " +
             *dir_ + "/corpus.jsonl, cache_dir: " + *dir_ + "/cache}\n";
  LoadedConfig v600 = load_config(*dir_ + "/v600.yaml", {});
  std::string other_tok = prepare_data(v600.config.data, 600, 1).tokenizer_path;
  Command vocab = run("generate " + ckpt() + " --tokenizer " + other_tok + " --prompt Emma");
  EXPECT_NE(vocab.status, 0);
  EXPECT_NE(vocab.err.find("has 600 pieces but model.vocab_size is 512"), std::string::npos)
      << vocab.err;
}

TEST_F(EvalTest, GreedyWithKvCacheEqualsWithoutAndSeedsRepeat) {
  EvalModel m = load_eval_model(ckpt(), "", "", true);
  std::vector<int64_t> prompt{1};
  for (int32_t id : m.tokenizer->encode("It was a fine morning, and Emma")) prompt.push_back(id);
  GenerateOptions o;
  o.max_new_tokens = 100;  // past the cache's first capacity (64 positions): it regrows
  o.greedy = true;
  o.eos_id = -1;  // run the full length
  std::vector<int64_t> cached = generate(m.model, prompt, o);
  o.use_cache = false;
  std::vector<int64_t> full = generate(m.model, prompt, o);
  EXPECT_EQ(cached.size(), 100u);
  EXPECT_EQ(cached, full);

  GenerateOptions s;
  s.max_new_tokens = 30;
  s.eos_id = -1;
  s.seed = 7;
  std::vector<int64_t> a = generate(m.model, prompt, s), b = generate(m.model, prompt, s);
  EXPECT_EQ(a, b);
  s.seed = 8;
  EXPECT_NE(generate(m.model, prompt, s), a);

  Command c = run("generate " + ckpt() + " --prompt 'Emma said' --max-new-tokens 12 --seed 3");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(c.out.rfind("Emma said", 0), 0u) << c.out;
  EXPECT_NE(c.err.find("tokens/s"), std::string::npos) << c.err;
  EXPECT_EQ(run("generate " + ckpt() + " --prompt 'Emma said' --max-new-tokens 12 --seed 3").out,
            c.out);
}

TEST(Sampling, FilterFollowsMiniMindsOrder) {
  GenerateOptions o;
  o.temperature = 1.0;
  o.top_k = 3;
  o.top_p = 1.0;
  torch::Tensor logits = torch::tensor({1.0f, 4.0f, 3.0f, 2.0f, 0.0f});
  torch::Tensor k = filter_logits(logits, {}, o);
  EXPECT_TRUE(std::isinf(k[0].item<float>()) && std::isinf(k[4].item<float>()));
  EXPECT_FLOAT_EQ(k[3].item<float>(), 2.0f);
  // top-p keeps the smallest set whose probability reaches p, including the crossing token.
  o.top_k = 0;
  o.top_p = 0.7;
  torch::Tensor p = filter_logits(logits, {}, o);  // softmax: .64 .24 .09 .03 .01
  EXPECT_FALSE(std::isinf(p[1].item<float>()));
  EXPECT_FALSE(std::isinf(p[2].item<float>()));
  EXPECT_TRUE(std::isinf(p[3].item<float>()));
  // Repetition penalty divides the logits of seen tokens; temperature comes first.
  o.top_p = 1.0;
  o.repetition_penalty = 2.0;
  o.temperature = 0.5;
  torch::Tensor r = filter_logits(logits, {1, 1, 3}, o);
  EXPECT_FLOAT_EQ(r[1].item<float>(), 4.0f);  // 4 / 0.5 / 2
  EXPECT_FLOAT_EQ(r[3].item<float>(), 2.0f);  // 2 / 0.5 / 2
  EXPECT_FLOAT_EQ(r[2].item<float>(), 6.0f);  // 3 / 0.5
}

TEST_F(EvalTest, ReportHasAHeatmapPerMoeLayerAndIsWellFormed) {
  const std::string moe = *dir_ + "/moe/report.html", dense = *dir_ + "/dense/report.html";
  ASSERT_TRUE(fs::exists(moe));  // written by the trainer at the end of the run
  const std::string check =
      std::string(MINIMIND_PYTHON) + " " + test::source_path("tests/reference/check_html.py") + " ";
  EXPECT_EQ(std::system((check + moe + " 2").c_str()), 0);
  EXPECT_EQ(std::system((check + dense + " 0").c_str()), 0);
  std::ifstream in(moe);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* part : {"Layer 0: expert share", "Layer 1: expert share", "MaxVio per layer",
                           "Normalised entropy", "Learning rate", "val loss", "fair share"})
    EXPECT_NE(html.find(part), std::string::npos) << part;
  EXPECT_NE(html.find("dashed red line: a collapse warning"), std::string::npos);  // heatmaps
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // --report rewrites it from the logs.
  fs::remove(moe);
  EXPECT_EQ(run("report " + *dir_ + "/moe").status, 0);
  EXPECT_TRUE(fs::exists(moe));
}

// The balancing lab's run: its report draws the bias per expert, the dropped fraction, z
// and the sequence spread; minimind-eval loads its weights (shared experts, bias buffer).
TEST_F(EvalTest, LabRunReportAndEvaluation) {
  const std::string html = test::read_text(*dir_ + "/lab/report.html");
  for (const char* part : {"Balancing methods", "Layer 0: selection bias per expert",
                           "Layer 1: selection bias per expert", "dropped by capacity",
                           "Router z per layer", "Worst sequence's MaxVio"})
    EXPECT_NE(html.find(part), std::string::npos) << part;
  const std::string check = std::string(MINIMIND_PYTHON) + " " +
                            test::source_path("tests/reference/check_html.py") + " " + *dir_ +
                            "/lab/report.html 2";
  EXPECT_EQ(std::system(check.c_str()), 0);
  // The MiniMind-3 run's report has no bias or capacity section (z is the router's health,
  // drawn for every learned router).
  const std::string plain = test::read_text(*dir_ + "/moe/report.html");
  EXPECT_EQ(plain.find("Balancing methods"), std::string::npos);
  EXPECT_NE(plain.find("Router z per layer"), std::string::npos);
  const Command c = run("loss " + *dir_ + "/lab --json");
  ASSERT_EQ(c.status, 0) << c.err;
  const auto j = nlohmann::json::parse(c.out);
  EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
  EXPECT_EQ(j.at("expert_load").size(), 2u);
}

// The routing analysis: written at the end of a MoE run (analysis.json, shown in
// report.html) and by --analyze on any corpora, as a page and as JSON.
TEST_F(EvalTest, AnalyzeWritesPageJsonAndTheReportShowsIt) {
  const std::string report = test::read_text(*dir_ + "/moe/report.html");
  for (const char* part : {"Is the router learning?", "Routing information MI per layer",
                           "What did the experts learn?", "Token view", "top-1 flow",
                           "Router saturation", "What each expert sees"})
    EXPECT_NE(report.find(part), std::string::npos) << part;
  EXPECT_TRUE(fs::exists(*dir_ + "/moe/analysis.json"));
  EXPECT_FALSE(fs::exists(*dir_ + "/dense/analysis.json"));

  // Two domains: the corpus split in two files.
  const std::string a = *dir_ + "/domain_a.jsonl", b = *dir_ + "/domain_b.jsonl";
  {
    std::ifstream in(test::small_corpus(*dir_));
    std::ofstream fa(a), fb(b);
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) (i % 2 ? fb : fa) << line << "\n";
  }
  const std::string page = *dir_ + "/analysis_page.html";
  const Command c = run("analyze " + *dir_ + "/moe --data novel_a=" + a + " --data novel_b=" + b +
                        " --out " + page + " --json");
  ASSERT_EQ(c.status, 0) << c.err;
  const auto j = nlohmann::json::parse(c.out);
  EXPECT_EQ(j.at("domains"), (std::vector<std::string>{"novel_a", "novel_b"}));
  EXPECT_EQ(j.at("layer").size(), 2u);
  // Checkpoints at steps 6 and 12 (keep 3): the final one compared with itself is 1.
  const auto& sat = j.at("saturation");
  EXPECT_EQ(sat.at("steps"), (std::vector<int64_t>{6, 12}));
  EXPECT_EQ(sat.at("saturation").back(), 1.0);
  EXPECT_EQ(sat.at("flip").front(), 0.0);
  for (const auto& l : j.at("layer")) {
    EXPECT_EQ(l.at("experts").size(), 4u);
    EXPECT_EQ(l.at("coactivation").size(), 0u);  // top-1
    const double mi = l.at("router").at("mi");
    EXPECT_TRUE(mi >= -1e-9 && mi <= 1) << mi;
    for (const auto& e : l.at("experts")) EXPECT_EQ(e.at("domain_share").size(), 2u);
  }
  const std::string html = test::read_text(page);
  EXPECT_NE(html.find("Domain × expert"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  const std::string check =
      std::string(MINIMIND_PYTHON) + " " + test::source_path("tests/reference/check_html.py") + " ";
  EXPECT_EQ(std::system((check + page).c_str()), 0);
  EXPECT_EQ(std::system((check + *dir_ + "/moe/report.html 2").c_str()), 0);
  EXPECT_NE(c.err.find("analysed"), std::string::npos) << c.err;
}

TEST_F(EvalTest, AnalyzeErrorsNameWhatIsWrong) {
  Command c = run("analyze " + *dir_ + "/dense");
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find("nothing to analyse"), std::string::npos) << c.err;
  const std::string bad = *dir_ + "/no_text.jsonl";
  test::write_text(bad, "{\"title\": \"x\"}\nnot json\n");
  c = run("analyze " + *dir_ + "/moe --data " + bad);
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find(bad), std::string::npos) << c.err;
  c = run("analyze " + *dir_ + "/moe --data web=" + *dir_ + "/missing.jsonl");
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find("missing.jsonl"), std::string::npos) << c.err;
  c = run("analyze " + *dir_ + "/moe --data " + *dir_);
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find("is a directory"), std::string::npos) << c.err;
  c = run("loss " + *dir_ + "/moe --data " + bad + " --data " + bad);
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.err.find("--data"), std::string::npos) << c.err;
}

// --compare: any two or more runs on one page, its table taken from each run's logs.
TEST_F(EvalTest, CompareWritesOnePageForSeveralRuns) {
  const std::string out = *dir_ + "/compare.html";
  const Command c =
      run("compare " + *dir_ + "/moe " + *dir_ + "/lab " + *dir_ + "/dense --out " + out);
  ASSERT_EQ(c.status, 0) << c.err;
  const std::string html = test::read_text(out);
  const std::string check = std::string(MINIMIND_PYTHON) + " " +
                            test::source_path("tests/reference/check_html.py") + " " + out;
  EXPECT_EQ(std::system(check.c_str()), 0);
  for (const char* dir : {"moe", "lab"}) {
    const RunSummary s = summarize_run(read_run_logs(*dir_ + "/" + dir));
    ASSERT_TRUE(s.val_loss.has_value());
    // The row: name, steps, the last evaluation's loss, MaxVio_global of layer 0.
    const std::string row =
        fmt::format("<tr><td>{}</td><td>12</td><td>{:.4f}</td>", dir, *s.val_loss);
    EXPECT_NE(html.find(row), std::string::npos) << row;
    EXPECT_NE(html.find(fmt::format("<td>{:.3f}</td>", s.max_vio_global.at(0))), std::string::npos);
  }
  // The routing information of the last evaluation, per layer.
  const RunSummary moe = summarize_run(read_run_logs(*dir_ + "/moe"));
  ASSERT_EQ(moe.mi.size(), 2u);
  ASSERT_TRUE(moe.mi[0] && moe.mi[1]);
  EXPECT_NE(html.find(fmt::format("<td>{:.3f} / {:.3f}</td>", *moe.mi[0], *moe.mi[1])),
            std::string::npos);
  EXPECT_EQ(summarize_run(read_run_logs(*dir_ + "/lab")).dropped.has_value(), true);
  EXPECT_FALSE(summarize_run(read_run_logs(*dir_ + "/moe")).dropped.has_value());
  for (const char* part : {"Validation loss", "MoE layer 1", "normalised routing entropy"})
    EXPECT_NE(html.find(part), std::string::npos) << part;
  // One run is not a comparison; evaluation options do not mix with it.
  Command one = run("compare " + *dir_ + "/moe");
  EXPECT_EQ(one.status, 1);
  EXPECT_NE(one.err.find("RUN"), std::string::npos) << one.err;
  Command mixed = run("compare " + *dir_ + "/moe " + *dir_ + "/lab --prompt Emma");
  EXPECT_EQ(mixed.status, 1);
  EXPECT_NE(mixed.err.find("--prompt"), std::string::npos) << mixed.err;
  // Two runs of the same leaf name: each labelled by its path's distinct part.
  fs::create_directories(*dir_ + "/a"), fs::create_directories(*dir_ + "/b");
  fs::copy(*dir_ + "/moe", *dir_ + "/a/run", fs::copy_options::recursive);
  fs::copy(*dir_ + "/lab", *dir_ + "/b/run", fs::copy_options::recursive);
  const std::string twins = *dir_ + "/twins.html";
  ASSERT_EQ(run("compare " + *dir_ + "/a/run " + *dir_ + "/b/run --out " + twins).status, 0);
  const std::string twins_html = test::read_text(twins);
  for (const char* label : {"<tr><td>a/run</td>", "<tr><td>b/run</td>"})
    EXPECT_NE(twins_html.find(label), std::string::npos) << label;
  Command missing = run("compare " + *dir_ + "/moe " + *dir_ + "/nothing-here");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("nothing-here"), std::string::npos) << missing.err;
}

// The dashed red lines at warning steps are named in the chart's legend.
TEST(ReportCharts, WarningLinesHaveALegendEntry) {
  const Series s{"L0", series_color(0), {{1, 0.5}, {10, 0.2}}};
  const StepAxis axis(10);
  const std::string with = line_chart("MaxVio", {s}, {5}, axis);
  EXPECT_NE(with.find("class=\"event\""), std::string::npos);
  EXPECT_NE(with.find(">collapse warning</text>"), std::string::npos) << with;
  EXPECT_NE(line_chart("MI", {s}, {5}, axis, true, "uninformative warning")
                .find(">uninformative warning</text>"),
            std::string::npos);
  EXPECT_EQ(line_chart("MaxVio", {s}, {}, axis).find("warning"), std::string::npos);
}

// Runs whose directories end in the same name are told apart by their paths.
TEST(CompareLabels, ShortestDistinctSuffixOfThePath) {
  using V = std::vector<std::string>;
  EXPECT_EQ(run_labels({"runs/moe", "runs/lab/"}), (V{"moe", "lab"}));
  EXPECT_EQ(run_labels({"/x/a/run", "/x/b/run", "/x/b/other"}), (V{"a/run", "b/run", "other"}));
  EXPECT_EQ(run_labels({"/s/p/a/run", "/s/q/a/run"}), (V{"p/a/run", "q/a/run"}));
  EXPECT_EQ(run_labels({"/x/run", "/x/./run/"}), (V{"run", "run (2)"}));
}

// Report axes: 4 to 6 ticks at round values (1, 2 or 5 x 10^k apart) covering the data.
TEST(ReportAxes, TicksAreFewRoundAndCoverTheRange) {
  const std::vector<std::pair<double, double>> ranges = {
      {0, 300}, {0, 8}, {0.000223, 0.00899}, {4.93, 8.8}, {0, 1}, {-3.2, 7.7}, {1, 1}, {0, 12345}};
  for (const auto& [lo, hi] : ranges) {
    const std::vector<double> t = axis_ticks(lo, hi);
    ASSERT_GE(t.size(), 4u) << lo << " " << hi;
    ASSERT_LE(t.size(), 6u) << lo << " " << hi;
    EXPECT_LE(t.front(), lo);
    EXPECT_GE(t.back(), hi);
    const double step = t[1] - t[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 ||
                std::abs(mantissa - 5) < 1e-6)
        << lo << " " << hi << " step " << step;
    for (double v : t) EXPECT_NEAR(v / step, std::round(v / step), 1e-6) << v;
  }
  EXPECT_EQ(axis_ticks(0, 300), (std::vector<double>{0, 100, 200, 300}));
}

TEST_F(EvalTest, InspectShowsHistogramsTrendsAndWarnings) {
  Command c = run("inspect " + *dir_ + "/moe");
  ASSERT_EQ(c.status, 0) << c.err;
  for (const char* part : {"train loss", "val loss", "L0 ", "L1 ", "maxvio", "entropy", "max share",
                           "MaxVio_global", "collapse warnings"})
    EXPECT_NE(c.out.find(part), std::string::npos) << part << "\n" << c.out;
  EXPECT_NE(run("inspect " + *dir_ + "/dense").out.find("dense model"), std::string::npos);
  EXPECT_NE(run("inspect " + *dir_ + "/nothing").status, 0);
}

TEST_F(EvalTest, UsageErrorsExitOneNamingTheOption) {
  // nan passed CLI11's ranges and reached the sampler; a seed past 2^63 was saturated.
  for (const char* args :
       {"--top-p 2", "--top-p nan", "--top-k -1", "--repetition-penalty 0",
        "--repetition-penalty 1e-300", "--temperature nan", "--temperature 1e-300",
        "--temperature inf", "--seed -5", "--seed 99999999999999999999999", "--threads 5000",
        "--no-such-option"}) {
    const Command c = run("generate " + ckpt() + " --prompt Emma " + args);
    EXPECT_EQ(c.status, 1) << args << "\n" << c.err;
    const std::string option = std::string(args).substr(0, std::string(args).find(' '));
    EXPECT_NE(c.err.find(option), std::string::npos) << args << "\n" << c.err;
  }
  for (const char* args : {"--max-docs 0", "--batch-size 0", "--prompt Emma"}) {
    const Command c = run("loss " + ckpt() + " " + args);
    EXPECT_EQ(c.status, 1) << args << "\n" << c.err;
    const std::string option = std::string(args).substr(0, std::string(args).find(' '));
    EXPECT_NE(c.err.find(option), std::string::npos) << args << "\n" << c.err;
  }
  // An empty prompt is refused, not taken as "evaluate the loss".
  const Command empty = run("generate " + ckpt() + " --prompt ''");
  EXPECT_EQ(empty.status, 1) << empty.err;
  EXPECT_NE(empty.err.find("--prompt is empty"), std::string::npos) << empty.err;
  EXPECT_TRUE(empty.out.empty()) << empty.out;
  // A run's logs are read alone: evaluation options alongside are usage errors.
  const Command both = run("inspect " + *dir_ + "/moe --prompt Emma");
  EXPECT_EQ(both.status, 1) << both.err;
  EXPECT_NE(both.err.find("--prompt"), std::string::npos) << both.err;
  EXPECT_EQ(run("--max-docs 3").status, 1);  // nothing to evaluate
  // The flag forms of earlier versions exit 1 naming the subcommand that replaced them.
  const std::vector<std::pair<std::string, std::string>> old_forms = {
      {"--checkpoint " + ckpt() + " --json", "minimind-eval loss " + ckpt() + " --json"},
      {"--checkpoint " + ckpt() + " --prompt Emma", "minimind-eval generate " + ckpt()},
      {"--inspect " + *dir_ + "/moe", "minimind-eval inspect " + *dir_ + "/moe"},
      {"--compare a b --compare-out c.html", "minimind-eval compare a b --out c.html"},
      {"--analyze x --analyze-out y.html", "minimind-eval analyze x --out y.html"}};
  for (const auto& [args, now] : old_forms) {
    const Command c = run(args);
    EXPECT_EQ(c.status, 1) << args;
    EXPECT_NE(c.err.find(now), std::string::npos) << args << "\n" << c.err;
  }
  // --help lists the subcommands; each subcommand's --help holds only its own options.
  const Command help = run("--help");
  EXPECT_EQ(help.status, 0);
  for (const char* sub : {"loss", "generate", "inspect", "report", "compare", "analyze"})
    EXPECT_NE(help.out.find(std::string("  ") + sub + " "), std::string::npos) << sub << help.out;
  EXPECT_EQ(help.out.find("--temperature"), std::string::npos) << help.out;
  const Command loss_help = run("loss --help");
  EXPECT_NE(loss_help.out.find("--truncate"), std::string::npos) << loss_help.out;
  EXPECT_EQ(loss_help.out.find("--temperature"), std::string::npos) << loss_help.out;
  const Command gen_help = run("generate --help");
  EXPECT_NE(gen_help.out.find("--temperature"), std::string::npos) << gen_help.out;
  EXPECT_EQ(gen_help.out.find("--truncate"), std::string::npos) << gen_help.out;
  // minimind-bench: zero measured steps used to end in a segmentation fault.
  Command bench{0, "", ""};
  const std::string err_file = test::temp_dir("bench_err") + "/err";
  bench.status = WEXITSTATUS(
      std::system((std::string(MINIMIND_BENCH_BIN) + " --steps 0 2>" + err_file).c_str()));
  EXPECT_EQ(bench.status, 1);
  EXPECT_NE(test::read_text(err_file).find("--steps"), std::string::npos)
      << test::read_text(err_file);
  // minimind-train: values past an option's range, and a model no machine could hold, are
  // refused before anything happens (here: before --overwrite would empty the run).
  const std::string config = test::source_path("configs/moe.yaml");
  for (const char* args : {"--seed -1", "--seed 99999999999999999999", "--threads 5000"}) {
    const int status =
        WEXITSTATUS(std::system((std::string(MINIMIND_TRAIN_BIN) + " --config " + config +
                                 " --print-config " + args + " 2>" + err_file + " >/dev/null")
                                    .c_str()));
    EXPECT_EQ(status, 1) << args;
    const std::string option = std::string(args).substr(0, std::string(args).find(' '));
    EXPECT_NE(test::read_text(err_file).find(option), std::string::npos)
        << test::read_text(err_file);
  }
  const int huge = WEXITSTATUS(
      std::system((std::string(MINIMIND_TRAIN_BIN) + " --config " + config + " --out " + *dir_ +
                   "/moe --overwrite --set model.num_hidden_layers=1024 --set "
                   "model.hidden_size=65536 --set data.train=" +
                   test::source_path("data/austen.jsonl") + " >" + err_file + " 2>&1")
                      .c_str()));
  EXPECT_EQ(huge, 1);
  EXPECT_NE(test::read_text(err_file).find("most of it is the model"), std::string::npos)
      << test::read_text(err_file);
  EXPECT_NE(test::read_text(err_file).find("model.num_hidden_layers (1024)"), std::string::npos)
      << test::read_text(err_file);
  EXPECT_TRUE(fs::exists(ckpt() + "/model.pth"));
  // A trace that cannot be written is said before minutes of benchmarking, not after.
  bench.status = WEXITSTATUS(std::system(
      (std::string(MINIMIND_BENCH_BIN) + " --profile /nonexistent/dir/trace.json 2>" + err_file)
          .c_str()));
  EXPECT_EQ(bench.status, 1);
  EXPECT_NE(test::read_text(err_file).find("--profile: cannot write"), std::string::npos)
      << test::read_text(err_file);
  // A file of the user's under a trace's or a page's name is refused and kept: --profile
  // used to empty it at start-up, even when the run then stopped on a bad --config, and
  // compare and analyze wrote their page over it.
  const std::string mine = test::temp_dir("users_file") + "/notes.txt";
  std::ofstream(mine) << "my notes\n";
  bench.status =
      WEXITSTATUS(std::system((std::string(MINIMIND_BENCH_BIN) +
                               " --config no-such-config --profile " + mine + " 2>" + err_file)
                                  .c_str()));
  EXPECT_EQ(bench.status, 1);
  EXPECT_NE(test::read_text(err_file).find("holds something other than a trace"), std::string::npos)
      << test::read_text(err_file);
  EXPECT_EQ(test::read_text(mine), "my notes\n");
  // Another program's Chrome trace, or notes that look like one, carry no mark of --profile:
  // refused and kept as well; an empty --profile is refused, not ignored.
  for (const std::string& text :
       {std::string(R"([{"name": "a", "ph": "X", "ts": 1, "dur": 2}])"),
        std::string(R"([{"name": "a", "ph": "X"}, {"name": "my notes"}])")}) {
    std::ofstream(mine, std::ios::trunc) << text;
    bench.status =
        WEXITSTATUS(std::system((std::string(MINIMIND_BENCH_BIN) +
                                 " --config no-such-config --profile " + mine + " 2>" + err_file)
                                    .c_str()));
    EXPECT_EQ(bench.status, 1) << text;
    EXPECT_NE(test::read_text(err_file).find("holds something other than a trace"),
              std::string::npos)
        << test::read_text(err_file);
    EXPECT_EQ(test::read_text(mine), text);
  }
  bench.status = WEXITSTATUS(
      std::system((std::string(MINIMIND_BENCH_BIN) + " --profile '' 2>" + err_file).c_str()));
  EXPECT_EQ(bench.status, 1);
  EXPECT_NE(test::read_text(err_file).find("--profile is empty"), std::string::npos)
      << test::read_text(err_file);
  std::ofstream(mine, std::ios::trunc) << "my notes\n";
  for (const std::string& args : {"compare " + *dir_ + "/moe " + *dir_ + "/moe --out " + mine,
                                  "analyze " + *dir_ + "/moe --out " + mine}) {
    const Command c = run(args);
    EXPECT_EQ(c.status, 1) << args;
    EXPECT_NE(c.err.find("holds something other than a page minimind-eval writes"),
              std::string::npos)
        << args << "\n"
        << c.err;
    EXPECT_EQ(test::read_text(mine), "my notes\n") << args;
  }
}

TEST_F(EvalTest, GenerationLimitsAreSaidNotSilent) {
  // The tiny model reads at most 128 positions: a longer prompt is refused with a reason.
  std::string prompt;
  for (int i = 0; i < 200; ++i) prompt += "Emma ";
  Command longer = run("generate " + ckpt() + " --greedy --prompt '" + prompt + "'");
  EXPECT_EQ(longer.status, 1);
  EXPECT_NE(longer.err.find("model.max_position_embeddings = 128"), std::string::npos)
      << longer.err;
  // Generating up to the limit says why it stopped.
  Command full = run("generate " + ckpt() + " --greedy --max-new-tokens 500 --prompt Emma");
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("stopped at model.max_position_embeddings = 128"), std::string::npos)
      << full.err;
  // Directories where files belong are named, not read.
  Command dir_data = run("loss " + ckpt() + " --data " + *dir_ + " --max-docs 3");
  EXPECT_EQ(dir_data.status, 1);
  EXPECT_NE(dir_data.err.find("is a directory, not a JSONL file"), std::string::npos)
      << dir_data.err;
  Command dir_tok = run("generate " + ckpt() + " --tokenizer " + *dir_ + " --prompt Emma");
  EXPECT_EQ(dir_tok.status, 1);
  EXPECT_NE(dir_tok.err.find("is a directory, not a tokenizer file"), std::string::npos)
      << dir_tok.err;
  // An empty tokenizer file is said to be empty (it was read as a broken sentencepiece model).
  std::ofstream(*dir_ + "/empty.json").flush();
  Command empty_tok =
      run("generate " + ckpt() + " --tokenizer " + *dir_ + "/empty.json --prompt Emma");
  EXPECT_EQ(empty_tok.status, 1);
  EXPECT_NE(empty_tok.err.find("/empty.json' is empty"), std::string::npos) << empty_tok.err;
  // A temperature so small that the logits overflow (the tool refuses it; a library caller
  // can pass it): an error, not a torch backtrace.
  EvalModel m = load_eval_model(ckpt(), "", "", false);
  GenerateOptions cold;
  cold.temperature = 1e-300;
  const std::string err = test::error_of<Error>([&] { generate(m.model, {1, 5, 6}, cold); });
  EXPECT_NE(err.find("non-finite probabilities (temperature 1e-300"), std::string::npos) << err;
}
