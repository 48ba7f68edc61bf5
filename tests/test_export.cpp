// minimind-export, checked by readers that are not ours: llama.cpp itself (node-llama-cpp's
// prebuilt CPU build) runs the GGUF files, Hugging Face's tokenizers (npm) reads
// tokenizer.json, and an independent Python reader (tests/reference/check_hf_export.py)
// parses model.safetensors and runs the weights in the PyTorch reference.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "minimind/config.h"
#include "minimind/data/prepare.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/eval/generate.h"
#include "minimind/export/export_model.h"
#include "minimind/train/trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace minimind;

namespace {

using test::Command;

Command export_cmd(const std::string& args) {
  return test::run_command(std::string(MINIMIND_EXPORT_BIN) + " " + args);
}

// The npm packages the test command installs (scripts/test.sh). Without them (a plain
// `ctest`) every test here is skipped saying how to get them; ctest counts the program as
// skipped (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt).
bool npm_packages_present() {
  const std::string modules = test::source_path("tests/export/node_modules");
  return fs::exists(modules + "/node-llama-cpp") && fs::exists(modules + "/@huggingface");
}
constexpr const char* kNoPackages =
    "export tests skipped: tests/export/node_modules is missing; install the test's npm "
    "packages with `npm ci --omit=optional --ignore-scripts --prefix tests/export` (bash "
    "scripts/test.sh does)";

std::string node_script(const std::string& name) {
  return "node " + test::source_path("tests/export") + "/" + name;
}

// What the checks need of one trained model.
struct Case {
  std::string name, run;
  std::vector<std::string> texts;               // the validation documents' texts
  std::vector<std::vector<int64_t>> text_ids;   // ours, without [bos] / [eos]
  std::vector<std::vector<int64_t>> sequences;  // [bos] + ids, for the log-probabilities
  std::vector<int64_t> prompt;                  // [bos] + the greedy prompt's ids
};

constexpr int64_t kGreedyTokens = 40;
constexpr int64_t kMinPositions = 256;

Case make_case(const std::string& dir, const std::string& name, const std::string& preset,
               const std::vector<std::string>& sets) {
  std::vector<std::string> overrides = {"train.max_steps=20",
                                        "train.warmup_steps=2",
                                        "train.eval_interval=20",
                                        "train.checkpoint_interval=20",
                                        "log.interval=10",
                                        "run.threads=1",
                                        "data.cache_dir=" + dir + "/cache"};
  overrides.insert(overrides.end(), sets.begin(), sets.end());
  const Config cfg = load_config(test::source_path("configs/" + preset), overrides).config;
  TrainOptions options;
  options.out_dir = dir + "/" + name;
  train(cfg, options);
  Case c{name, options.out_dir, {}, {}, {}, {}};
  EvalModel m = load_eval_model(c.run, "", "", true);
  const TokenFile val = TokenFile::open(prepare_data(cfg.data, cfg.model.vocab_size, 1).val_path);
  int64_t positions = 0;
  for (uint64_t d = 0; d < val.num_docs(); ++d) {
    std::vector<int64_t> doc(val.doc_length(d));
    val.copy(val.doc_start(d), doc.size(), doc.data());
    const std::vector<int64_t> body(doc.begin() + 1, doc.end() - 1);
    c.text_ids.push_back(body);
    c.texts.push_back(m.tokenizer->decode(std::vector<int32_t>(body.begin(), body.end())));
    if (positions < kMinPositions) {
      c.sequences.emplace_back(doc.begin(), doc.end() - 1);  // [bos] + text
      positions += static_cast<int64_t>(c.sequences.back().size()) - 1;
    }
  }
  c.prompt = {m.tokenizer->specials().bos};
  for (int32_t id : m.tokenizer->encode("It is a truth universally acknowledged"))
    c.prompt.push_back(id);
  return c;
}

// Ours: log p(next token) at every position of each sequence, [sequence][position][V].
std::vector<torch::Tensor> our_logprobs(EvalModel& m, const Case& c) {
  torch::NoGradGuard no_grad;
  m.model->eval();
  std::vector<torch::Tensor> out;
  for (const auto& ids : c.sequences) {
    const torch::Tensor x = torch::tensor(ids, torch::kLong).unsqueeze(0);           // [1, T]
    out.push_back(torch::log_softmax(m.model(x).logits[0].to(torch::kDouble), -1));  // [T, V]
  }
  return out;
}

// The chat_template of MiniMind's tokenizer_config.json (tests/data).
std::string minimind_chat_template() {
  return nlohmann::json::parse(test::read_text(test::source_path(
                                   "tests/data/minimind-tokenizer/tokenizer_config.json")))
      .at("chat_template")
      .get<std::string>();
}

// llama.cpp's answers for a GGUF file on the case's texts, sequences and prompt.
nlohmann::json llama_cpp(const std::string& gguf, const Case& c, const std::string& work) {
  nlohmann::json cases = {{"texts", c.texts},
                          {"sequences", c.sequences},
                          {"greedy", {{"prompt", c.prompt}, {"tokens", kGreedyTokens}}}};
  const std::string path = work + "/" + c.name + ".cases.json";
  test::write_text(path, cases.dump());
  const Command r = test::run_command(node_script("check_gguf.mjs") + " " + gguf + " " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

// The largest difference between llama.cpp's log-probabilities and ours: of each next
// token, and of the 5 tokens llama.cpp ranks first. Counts the positions compared.
double max_logprob_diff(const nlohmann::json& ll, const std::vector<torch::Tensor>& ours,
                        int64_t& positions, const Case& c) {
  double worst = 0;
  positions = 0;
  for (size_t s = 0; s < ours.size(); ++s) {
    const auto& lp = ll.at("logprobs").at(s);
    const auto& top = ll.at("top").at(s);
    for (size_t t = 0; t < lp.size(); ++t, ++positions) {
      const int64_t next = c.sequences[s][t + 1];
      worst = std::max(worst, std::abs(lp[t].get<double>() - ours[s][t][next].item<double>()));
      for (const auto& entry : top[t])
        worst = std::max(worst, std::abs(entry[1].get<double>() -
                                         ours[s][t][entry[0].get<int64_t>()].item<double>()));
    }
  }
  return worst;
}

class ExportTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("export"));
    cases_ = new std::map<std::string, Case>;
    if (!npm_packages_present()) {
      std::printf("%s\n", kNoPackages);
      return;
    }
    // The default preset's model, its dense twin, renormalised top-2 (qwen3moe), and a lab
    // model with sigmoid scores, a selection bias and 2 shared experts, top-2 of 8 (hy_v3).
    (*cases_)["moe"] = make_case(*dir_, "moe", "moe.yaml", {});
    (*cases_)["dense"] = make_case(*dir_, "dense", "dense.yaml", {});
    (*cases_)["top2"] = make_case(*dir_, "top2", "moe.yaml",
                                  {"model.num_experts_per_tok=2", "model.norm_topk_prob=true"});
    (*cases_)["lab"] = make_case(
        *dir_, "lab", "moe.yaml",
        {"model.num_experts=8", "model.num_experts_per_tok=2", "model.norm_topk_prob=true",
         "model.scoring_func=sigmoid", "model.router_bias_update_rate=0.01",
         "model.n_shared_experts=2", "model.moe_intermediate_size=112"});
    // Quantile balancing: its solved bias chooses as the sign rule's does (hy_v3's
    // exp_probs_b), so the GGUF must compute the same routing.
    (*cases_)["qb"] = make_case(
        *dir_, "qb", "moe.yaml",
        {"model.num_experts=8", "model.num_experts_per_tok=2", "model.norm_topk_prob=true",
         "model.scoring_func=sigmoid", "model.router_aux_loss_coef=0",
         "model.router_bias_rule=quantile", "model.qb_estimator=exact"});
    // The default preset on MiniMind's own tokenizer.json (byte-level BPE): llama.cpp's
    // "gpt2" vocabulary and Hugging Face's tokenizers must give its ids.
    (*cases_)["mmtok"] = make_case(
        *dir_, "mmtok", "moe.yaml",
        {"data.tokenizer=" + test::source_path("tests/data/minimind-tokenizer/tokenizer.json")});
  }
  static void TearDownTestSuite() {
    delete cases_;
    delete dir_;
  }
  void SetUp() override {
    if (!npm_packages_present()) GTEST_SKIP() << kNoPackages;
  }
  static std::string* dir_;
  static std::map<std::string, Case>* cases_;
};
std::string* ExportTest::dir_ = nullptr;
std::map<std::string, Case>* ExportTest::cases_ = nullptr;

// What minimind-export refuses and what it never loses need no npm package: a fixture of
// their own (ctest's export_refusals, never skipped), with the two runs they read.
class ExportRefusals : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("export_refusals"));
    cases_ = new std::map<std::string, Case>;
    (*cases_)["moe"] = make_case(*dir_, "moe", "moe.yaml", {});
    (*cases_)["lab"] = make_case(
        *dir_, "lab", "moe.yaml",
        {"model.num_experts=8", "model.num_experts_per_tok=2", "model.norm_topk_prob=true",
         "model.scoring_func=sigmoid", "model.router_bias_update_rate=0.01",
         "model.n_shared_experts=2", "model.moe_intermediate_size=112"});
  }
  static void TearDownTestSuite() {
    delete cases_;
    delete dir_;
  }
  static std::string* dir_;
  static std::map<std::string, Case>* cases_;
};
std::string* ExportRefusals::dir_ = nullptr;
std::map<std::string, Case>* ExportRefusals::cases_ = nullptr;

}  // namespace

// Each model as llama.cpp runs it: its token ids equal ours on the whole validation split,
// its next-token log-probabilities equal ours within 1e-4 on at least 256 positions, and
// its 40-token greedy continuation is ours.
TEST_F(ExportTest, LlamaCppRunsTheGgufExactly) {
  const std::map<std::string, std::string> arch = {{"moe", "hy_v3"},     {"dense", "qwen3"},
                                                   {"top2", "qwen3moe"}, {"lab", "hy_v3"},
                                                   {"qb", "hy_v3"},      {"mmtok", "hy_v3"}};
  for (const auto& [name, c] : *cases_) {
    SCOPED_TRACE(name);
    const std::string gguf = *dir_ + "/" + name + ".gguf";
    const Command e = export_cmd(c.run + " --format gguf --out " + gguf);
    ASSERT_EQ(e.status, 0) << e.err;
    EXPECT_NE(e.err.find("architecture " + arch.at(name)), std::string::npos) << e.err;
    const nlohmann::json ll = llama_cpp(gguf, c, *dir_);
    ASSERT_TRUE(ll.contains("tokens"));
    int64_t same = 0;
    for (size_t i = 0; i < c.texts.size(); ++i)
      same += ll["tokens"][i].get<std::vector<int64_t>>() == c.text_ids[i];
    EXPECT_EQ(same, static_cast<int64_t>(c.texts.size())) << "texts tokenised as we do";
    // MiniMind's tokenizer.json came with its chat template: the file carries it, under
    // llama.cpp's key; our sentencepiece tokenizers carry MiniMind-3's in our words.
    EXPECT_EQ(ll["chat_template"],
              name == "mmtok" ? minimind_chat_template() : ChatTemplate::minimind3().jinja());
    EvalModel m = load_eval_model(c.run, "", "", true);
    int64_t positions = 0;
    const double diff = max_logprob_diff(ll, our_logprobs(m, c), positions, c);
    std::printf("%s (%s): %lld positions, largest log-probability difference %.3g\n", name.c_str(),
                arch.at(name).c_str(), static_cast<long long>(positions), diff);
    EXPECT_GE(positions, kMinPositions);
    EXPECT_LE(diff, 1e-4);
    GenerateOptions greedy;
    greedy.greedy = true, greedy.max_new_tokens = kGreedyTokens, greedy.eos_id = -1;
    EXPECT_EQ(ll["greedy"].get<std::vector<int64_t>>(), generate(m.model, c.prompt, greedy));
  }
  // The greedy text minimind-eval prints is llama.cpp's too.
  const Case& c = cases_->at("moe");
  const nlohmann::json ll = llama_cpp(*dir_ + "/moe.gguf", c, *dir_);
  const Command ours =
      test::run_command(std::string(MINIMIND_EVAL_BIN) + " generate " + c.run +
                        " --prompt 'It is a truth universally acknowledged' --greedy "
                        "--ignore-eos --max-new-tokens 40");
  ASSERT_EQ(ours.status, 0) << ours.err;
  EvalModel m = load_eval_model(c.run, "", "", true);
  const auto ids = ll["greedy"].get<std::vector<int32_t>>();
  EXPECT_EQ(ours.out, "It is a truth universally acknowledged" + m.tokenizer->decode(ids) + "\n");
}

// A conversation through the GGUF as a node-llama-cpp user chats: the chat wrapper it
// resolves from the file's chat_template turns each conversation into the prompt ids
// minimind-eval tokenize --chat --generation-prompt --think makes (node-llama-cpp opens the
// think block, as chat --think does), and llama.cpp's greedy answer, to the end of the turn,
// is the text minimind-eval chat --greedy --think writes. Conversations with a system turn,
// several turns, and a language other than English; for MiniMind's tokenizer.json with its
// template and for the tool's sentencepiece tokenizer with ours (ChatTemplate::jinja).
TEST_F(ExportTest, LlamaCppChatsAsMinimindEvalDoes) {
  const nlohmann::json conversations = nlohmann::json::parse(R"([
    [{"role": "user", "content": "Who is Mr Darcy?"}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Where does Elizabeth live?"},
     {"role": "assistant", "content": "At Longbourn, in Hertfordshire."},
     {"role": "user", "content": "And her sister Jane?"}],
    [{"role": "user", "content": "Bonjour ! Qui êtes-vous ?"}]
  ])");
  const std::string data = *dir_ + "/chat.jsonl", cases = *dir_ + "/chat.cases.json";
  std::string lines;
  for (const auto& conv : conversations)
    lines += nlohmann::json{{"conversations", conv}}.dump() + "\n";
  test::write_text(data, lines);
  const int64_t tokens = 48;
  test::write_text(cases,
                   nlohmann::json{{"conversations", conversations}, {"tokens", tokens}}.dump());
  const std::string eval = std::string(MINIMIND_EVAL_BIN);
  // MiniMind's tokenizer.json with its own template, and ours (sentencepiece) with ours, each
  // model fine-tuned on the test conversations first (150 steps: its answers vary, and some
  // close their turn).
  int64_t ended = 0;
  for (const char* name : {"mmtok", "moe"}) {
    SCOPED_TRACE(name);
    const std::string run = *dir_ + "/" + name + "-chat";
    {
      const Config cfg =
          load_config(test::source_path("configs/sft.yaml"),
                      {"train.init_from=" + cases_->at(name).run,
                       "data.train=" + test::source_path("tests/data/chat-corpus.jsonl"),
                       "data.val=", "data.val_fraction=0", "data.max_seq_len=128",
                       "data.cache_dir=" + *dir_ + "/cache", "train.batch_size=4",
                       "train.max_steps=150", "train.learning_rate=2e-3", "train.warmup_steps=5",
                       "train.checkpoint_interval=150", "run.threads=1"})
              .config;
      TrainOptions options;
      options.out_dir = run;
      train(cfg, options);
    }
    const std::string gguf = run + ".gguf";
    const Command e = export_cmd(run + " --format gguf --out " + gguf);
    ASSERT_EQ(e.status, 0) << e.err;
    const Command node =
        test::run_command(node_script("check_chat.mjs") + " " + gguf + " " + cases);
    ASSERT_EQ(node.status, 0) << node.err;
    const nlohmann::json ll = nlohmann::json::parse(node.out);
    EXPECT_EQ(ll["wrapper"], "JinjaTemplate") << "node-llama-cpp renders the file's template";

    const Command prompts = test::run_command(eval + " tokenize " + run + " --chat --data " + data +
                                              " --generation-prompt --think --json");
    ASSERT_EQ(prompts.status, 0) << prompts.err;
    test::write_text(*dir_ + "/chat.prompts.jsonl", prompts.out);
    const std::vector<nlohmann::json> ours_prompts =
        test::read_jsonl(*dir_ + "/chat.prompts.jsonl");
    ASSERT_EQ(ours_prompts.size(), conversations.size());
    const Command answers =
        test::run_command(eval + " chat " + run + " --data " + data +
                          " --json --greedy --think --max-new-tokens " + std::to_string(tokens));
    ASSERT_EQ(answers.status, 0) << answers.err;
    const nlohmann::json ours = nlohmann::json::parse(answers.out);
    EvalModel m = load_eval_model(run, "", "", true);
    for (size_t i = 0; i < conversations.size(); ++i) {
      SCOPED_TRACE("conversation " + std::to_string(i + 1));
      ended += ll["ended"][i].get<bool>();
      EXPECT_EQ(ll["prompts"][i].get<std::vector<int64_t>>(),
                ours_prompts[i]["ids"].get<std::vector<int64_t>>());
      const auto ids = ll["answers"][i].get<std::vector<int32_t>>();
      EXPECT_FALSE(ids.empty());
      EXPECT_EQ(ours["answers"][i]["text"].get<std::string>(), m.tokenizer->decode(ids));
      EXPECT_EQ(ours["answers"][i]["ended"].get<bool>(), ll["ended"][i].get<bool>());
    }
  }
  EXPECT_GT(ended, 0) << "not vacuous: some answer closes its turn";
}

// f16 and bf16 weight matrices (norms, router and bias stay f32): the log-probabilities
// move by the weights' rounding, not more. f16 keeps 11 significant bits, bf16 8, so a
// weight moves by up to 2^-11 or 2^-8 of itself and a log-probability by about that much of
// the logits' spread. Measured on the default preset's model after 20 steps (414
// positions): f16 4.3e-4, bf16 3.6e-2; the bounds are about 3x that.
TEST_F(ExportTest, HalfPrecisionGgufIsCloseToFloat) {
  const Case& c = cases_->at("moe");
  EvalModel m = load_eval_model(c.run, "", "", true);
  const std::vector<torch::Tensor> ours = our_logprobs(m, c);
  for (const auto& [dtype, tol] :
       std::vector<std::pair<std::string, double>>{{"f16", 1.5e-3}, {"bf16", 1e-1}}) {
    const std::string gguf = *dir_ + "/moe-" + dtype + ".gguf";
    const Command e = export_cmd(c.run + " --format gguf --dtype " + dtype + " --out " + gguf);
    ASSERT_EQ(e.status, 0) << e.err;
    const std::string f32 = *dir_ + "/moe-f32.gguf";
    if (!fs::exists(f32)) {
      ASSERT_EQ(export_cmd(c.run + " --format gguf --out " + f32).status, 0);
    }
    EXPECT_LT(fs::file_size(gguf), fs::file_size(f32) * 0.6);
    const nlohmann::json ll = llama_cpp(gguf, c, *dir_);
    ASSERT_TRUE(ll.contains("logprobs"));
    int64_t positions = 0;
    const double diff = max_logprob_diff(ll, ours, positions, c);
    std::printf("%s: largest log-probability difference %.3g over %lld positions\n", dtype.c_str(),
                diff, static_cast<long long>(positions));
    EXPECT_LE(diff, tol) << dtype;
  }
}

// The Hugging Face directory: read by an independent safetensors reader and run in the
// PyTorch reference (logits within 1e-5), its tokenizer.json run by Hugging Face's own
// tokenizers (our ids on the whole validation split; [bos] first where the export wrote the
// tokenizer.json from our sentencepiece model, none where it copied MiniMind's, which adds
// none, as MiniMind's own scripts expect).
TEST_F(ExportTest, HuggingFaceDirectoryReproducesOurLogitsAndIds) {
  for (const std::string name : {"moe", "dense", "top2", "mmtok"}) {
    SCOPED_TRACE(name);
    const Case& c = cases_->at(name);
    const bool copied = name == "mmtok";
    const std::string out = *dir_ + "/" + name + "-hf";
    const Command e = export_cmd(c.run + " --format hf --out " + out);
    ASSERT_EQ(e.status, 0) << e.err;
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors",
                          "tokenizer.json", "tokenizer_config.json"})
      EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
    EXPECT_EQ(fs::exists(out + "/tokenizer.model"), !copied);
    if (copied) {
      EXPECT_EQ(test::read_text(out + "/tokenizer.json"),
                test::read_text(test::source_path("tests/data/minimind-tokenizer/tokenizer.json")));
    }
    // The chat template, for apply_chat_template: the one a tokenizer.json came with, or
    // MiniMind-3's in our words.
    const nlohmann::json tok_config =
        nlohmann::json::parse(test::read_text(out + "/tokenizer_config.json"));
    EXPECT_EQ(tok_config.value("chat_template", ""),
              copied ? minimind_chat_template() : ChatTemplate::minimind3().jinja());
    const nlohmann::json config = nlohmann::json::parse(test::read_text(out + "/config.json"));
    EXPECT_EQ(config["architectures"][0],
              name == "dense" ? "Qwen3ForCausalLM" : "Qwen3MoeForCausalLM");
    if (name != "dense") {
      EXPECT_EQ(config["norm_topk_prob"], name == "top2");
    }
    // Our logits on the first sequence, for the reference to reproduce.
    EvalModel m = load_eval_model(c.run, "", "", true);
    torch::NoGradGuard no_grad;
    m.model->eval();
    const torch::Tensor ids = torch::tensor(c.sequences[0], torch::kLong).unsqueeze(0);  // [1, T]
    const torch::Tensor logits = m.model(ids).logits;  // [1, T, V]
    const std::vector<char> pickled =
        torch::pickle_save(c10::IValue(std::vector<torch::Tensor>{ids, logits}));
    test::write_text(out + "-ours.pt", std::string(pickled.begin(), pickled.end()));
    const Command py = test::run_command(std::string(MINIMIND_PYTHON) + " " +
                                         test::source_path("tests/reference/check_hf_export.py") +
                                         " " + out + " " + out + "-ours.pt");
    EXPECT_EQ(py.status, 0) << py.out << py.err;
    std::printf("%s", py.out.c_str());
    // tokenizer.json under Hugging Face's tokenizers.
    test::write_text(out + "-texts.json", nlohmann::json(c.texts).dump());
    const Command tk = test::run_command(node_script("check_hf_tokenizer.mjs") + " " + out + " " +
                                         out + "-texts.json");
    ASSERT_EQ(tk.status, 0) << tk.err;
    const nlohmann::json hf = nlohmann::json::parse(tk.out);
    int64_t same = 0;
    for (size_t i = 0; i < c.texts.size(); ++i) {
      std::vector<int64_t> want;
      if (!copied) want.push_back(SpecialIds{}.bos);
      want.insert(want.end(), c.text_ids[i].begin(), c.text_ids[i].end());
      same += hf["ids"][i].get<std::vector<int64_t>>() == want;
    }
    EXPECT_EQ(same, static_cast<int64_t>(c.texts.size()));
  }
}

// What the target cannot compute is refused, naming the key and why; nothing is written.
TEST_F(ExportRefusals, WhatTheTargetCannotComputeIsRefusedNamingTheKey) {
  const Case& lab = cases_->at("lab");
  const Command hf = export_cmd(lab.run + " --format hf --out " + *dir_ + "/lab-hf");
  EXPECT_EQ(hf.status, 1);
  EXPECT_NE(hf.err.find("model.scoring_func = sigmoid"), std::string::npos) << hf.err;
  EXPECT_FALSE(fs::exists(*dir_ + "/lab-hf"));
  ModelConfig capacity;
  capacity.use_moe = true, capacity.capacity_factor = 1.25;
  EXPECT_NE(test::error_of<ConfigError>([&] {
              gguf_architecture(capacity);
            }).find("model.capacity_factor"),
            std::string::npos);
  ModelConfig hash;
  hash.use_moe = true, hash.router = RouterKind::hash;
  EXPECT_NE(
      test::error_of<ConfigError>([&] { gguf_architecture(hash); }).find("model.router = hash"),
      std::string::npos);
  ModelConfig shared;
  shared.use_moe = true, shared.n_shared_experts = 1;
  EXPECT_EQ(gguf_architecture(shared), "hy_v3");
  EXPECT_NE(
      test::error_of<ConfigError>([&] { hf_architecture(shared); }).find("model.n_shared_experts"),
      std::string::npos);
  // DeepSeek-V4's scores and scale: neither llama.cpp nor Qwen3-MoE computes them.
  ModelConfig v4;
  v4.use_moe = true, v4.scoring_func = ScoringFunc::sqrtsoftplus;
  for (auto* arch : {&gguf_architecture, &hf_architecture})
    EXPECT_NE(
        test::error_of<ConfigError>([&] { (*arch)(v4); }).find("model.scoring_func = sqrtsoftplus"),
        std::string::npos);
  // Hash-routed layers choose by a token-id table: neither runtime has one.
  ModelConfig hashed;
  hashed.use_moe = true, hashed.hash_layers = 1;
  for (auto* arch : {&gguf_architecture, &hf_architecture})
    EXPECT_NE(test::error_of<ConfigError>([&] { (*arch)(hashed); }).find("model.hash_layers"),
              std::string::npos);
  // Quantile balancing's bias: carried by the GGUF (above), not by Qwen3-MoE.
  ModelConfig qb;
  qb.use_moe = true, qb.router_bias_rule = BiasRule::quantile;
  EXPECT_EQ(gguf_architecture(qb), "hy_v3");
  EXPECT_NE(test::error_of<ConfigError>([&] {
              hf_architecture(qb);
            }).find("model.router_bias_rule = quantile"),
            std::string::npos);
  ModelConfig scaled;
  scaled.use_moe = true, scaled.routed_scaling_factor = 1.5;
  for (auto* arch : {&gguf_architecture, &hf_architecture})
    EXPECT_NE(
        test::error_of<ConfigError>([&] { (*arch)(scaled); }).find("model.routed_scaling_factor"),
        std::string::npos);
}

// An existing --out is kept unless --overwrite, and --overwrite replaces only a GGUF file
// (a user's other file of that name stays); a damaged checkpoint is minimind-eval's error;
// a full disk leaves no partial file.
TEST_F(ExportRefusals, BadInputLosesNothing) {
  const Case& c = cases_->at("moe");
  const std::string out = *dir_ + "/kept.gguf";
  test::write_text(out, "mine");
  Command e = export_cmd(c.run + " --format gguf --out " + out);
  EXPECT_EQ(e.status, 1);
  EXPECT_NE(e.err.find("--overwrite"), std::string::npos) << e.err;
  EXPECT_EQ(test::read_text(out), "mine");
  e = export_cmd(c.run + " --format gguf --out " + out + " --overwrite");
  EXPECT_EQ(e.status, 1);
  EXPECT_NE(e.err.find("is not a GGUF file, so --overwrite leaves it as it is"), std::string::npos)
      << e.err;
  EXPECT_EQ(test::read_text(out), "mine");
  fs::remove(out);
  ASSERT_EQ(export_cmd(c.run + " --format gguf --out " + out).status, 0);
  const auto first = fs::last_write_time(out);
  e = export_cmd(c.run + " --format gguf --out " + out + " --overwrite");
  EXPECT_EQ(e.status, 0) << e.err;
  EXPECT_EQ(test::read_text(out).substr(0, 4), "GGUF");
  EXPECT_NE(fs::last_write_time(out), first);
  EXPECT_EQ(export_cmd(c.run + " --format onnx --out x").status, 1);
  // A truncated model.pth: the error minimind-eval gives.
  const std::string broken = *dir_ + "/broken";
  fs::copy(c.run + "/checkpoints/step_00000020", broken, fs::copy_options::recursive);
  fs::resize_file(broken + "/model.pth", 1000);
  e = export_cmd(broken + " --tokenizer " + c.run + "/tokenizer.model --format gguf --out " +
                 *dir_ + "/broken.gguf");
  EXPECT_EQ(e.status, 1);
  EXPECT_NE(e.err.find("model.pth' is damaged"), std::string::npos) << e.err;
  EXPECT_FALSE(fs::exists(*dir_ + "/broken.gguf"));

  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs for the full disk";
  const std::string full = *dir_ + "/full";
  const test::TmpfsMount disk(full, "2m");
  ASSERT_TRUE(disk.mounted);
  for (const std::string format : {"gguf", "hf"}) {
    e = export_cmd(cases_->at("moe").run + " --format " + format + " --out " + full + "/m");
    EXPECT_EQ(e.status, 1) << format;
    EXPECT_NE(e.err.find("No space left on device"), std::string::npos) << e.err;
    EXPECT_TRUE(fs::is_empty(full)) << format << ": a partial file was left";
  }
}
