// Config: defaults, derived sizes, shipped presets, overrides, round trip, and each class
// of error (unknown key, wrong type, invalid value, bad YAML), which must name key and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "minimind/config.h"
#include "support/test_support.h"

using namespace minimind;

namespace {

// Parses + validates; returns the ConfigError message ("" if none was thrown).
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    Config cfg = load_config_string(yaml, "test.yaml");
    for (const auto& o : overrides) apply_override(cfg, o);
    validate_and_resolve(cfg);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& yaml, const std::vector<std::string>& parts,
                  const std::vector<std::string>& overrides = {}) {
  const std::string msg = error_of(yaml, overrides);
  ASSERT_FALSE(msg.empty()) << "no error for:\n" << yaml;
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

std::string shipped(const std::string& name) {
  return test::source_path("configs/" + name);
}

}  // namespace

TEST(ConfigDefaults, EmptyFileGivesMiniMindDefaults) {
  Config cfg = load_config_string("", "empty.yaml");
  validate_and_resolve(cfg);
  EXPECT_EQ(cfg.model.hidden_size, 768);
  EXPECT_EQ(cfg.model.num_hidden_layers, 8);
  EXPECT_EQ(cfg.model.num_attention_heads, 8);
  EXPECT_EQ(cfg.model.num_key_value_heads, 4);
  EXPECT_EQ(cfg.model.vocab_size, 6400);
  EXPECT_EQ(cfg.model.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(cfg.model.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(cfg.model.rms_norm_eps, 1e-6);
  EXPECT_EQ(*cfg.model.intermediate_size, 2432);
  EXPECT_EQ(*cfg.model.moe_intermediate_size, 2432);
  EXPECT_TRUE(cfg.model.tie_word_embeddings);
  EXPECT_FALSE(cfg.model.use_moe);
  EXPECT_EQ(cfg.model.num_experts, 4);
  EXPECT_EQ(cfg.model.num_experts_per_tok, 1);
  EXPECT_TRUE(cfg.model.norm_topk_prob);
  EXPECT_DOUBLE_EQ(cfg.model.router_aux_loss_coef, 5e-4);
  EXPECT_EQ(cfg.train.batch_size, 32);
  EXPECT_EQ(cfg.train.accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(cfg.train.learning_rate, 5e-4);
  EXPECT_DOUBLE_EQ(cfg.train.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(cfg.train.weight_decay, 0.01);
}

TEST(ConfigDefaults, DerivedIntermediateSizeMatchesMiniMind) {
  // ceil(hidden * pi / 64) * 64, values from docs/minimind-spec.md
  EXPECT_EQ(default_intermediate_size(768), 2432);
  EXPECT_EQ(default_intermediate_size(512), 1664);
  EXPECT_EQ(default_intermediate_size(256), 832);
  EXPECT_EQ(default_intermediate_size(128), 448);
  Config cfg = load_config_string("model:\n  hidden_size: 256\n  intermediate_size: null\n", "t");
  validate_and_resolve(cfg);
  EXPECT_EQ(*cfg.model.intermediate_size, 832);
  Config set = load_config_string("model:\n  intermediate_size: 1000\n", "t");
  validate_and_resolve(set);
  EXPECT_EQ(*set.model.intermediate_size, 1000);
  EXPECT_EQ(*set.model.moe_intermediate_size, 1000);  // follows intermediate_size
}

TEST(ConfigPresets, ShippedConfigsLoadAndValidate) {
  for (const char* name :
       {"moe.yaml", "dense.yaml", "minimind-3.yaml", "minimind-3-moe.yaml", "moe-switch.yaml",
        "moe-deepseek.yaml", "minimind2-moe.yaml", "sft.yaml"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_config(shipped(name), {}));
  }
  LoadedConfig moe = load_config(shipped("moe.yaml"), {});
  LoadedConfig dense = load_config(shipped("dense.yaml"), {});
  EXPECT_TRUE(moe.config.model.use_moe);
  EXPECT_FALSE(dense.config.model.use_moe);
  // The dense twin has the same shapes, so the same active parameters (see model tests).
  EXPECT_EQ(moe.config.model.hidden_size, dense.config.model.hidden_size);
  EXPECT_EQ(moe.config.model.num_hidden_layers, dense.config.model.num_hidden_layers);
  EXPECT_EQ(*moe.config.model.moe_intermediate_size, *dense.config.model.intermediate_size);
  // sft.yaml fine-tunes the default run: moe.yaml's model, chat data.
  LoadedConfig sft = load_config(shipped("sft.yaml"), {});
  EXPECT_TRUE(config_differences(moe.config, sft.config, "model").empty());
  EXPECT_EQ(sft.config.data.mode, "sft");
}

TEST(ConfigWarnings, Top1WithRenormalisationWarnsAboutIssue858) {
  LoadedConfig real = load_config(shipped("minimind-3-moe.yaml"), {});
  ASSERT_EQ(real.warnings.size(), 1u);
  EXPECT_NE(real.warnings[0].find("#858"), std::string::npos);
  EXPECT_NE(real.warnings[0].find("no gradient to the router"), std::string::npos);
  // The tiny preset chose norm_topk_prob: false deliberately, so it does not warn.
  EXPECT_TRUE(load_config(shipped("moe.yaml"), {}).warnings.empty());
  // k = 2 with renormalisation is fine.
  EXPECT_TRUE(load_config(shipped("minimind-3-moe.yaml"), {"model.num_experts_per_tok=2"})
                  .warnings.empty());
}

TEST(ConfigOverrides, SetChangesValuesBeforeValidation) {
  LoadedConfig c = load_config(shipped("moe.yaml"),
                               {"train.max_steps=70", "model.norm_topk_prob=true",
                                "data.val=some/file.jsonl", "model.intermediate_size=null"});
  EXPECT_EQ(c.config.train.max_steps, 70);
  EXPECT_TRUE(c.config.model.norm_topk_prob);
  EXPECT_EQ(c.config.data.val, "some/file.jsonl");
  EXPECT_EQ(*c.config.model.intermediate_size, 448);
  EXPECT_EQ(c.config.origin.at("train.max_steps"), "--set train.max_steps=70");
  EXPECT_EQ(c.warnings.size(), 1u);  // now top-1 with renormalisation
  // An override makes an invalid value that validation then reports with its origin.
  expect_error("",
               {"model.num_experts_per_tok", "--set model.num_experts_per_tok=9",
                "more than model.num_experts"},
               {"model.num_experts_per_tok=9"});
}

TEST(ConfigOverrides, BadSetIsAnError) {
  expect_error("", {"expected section.key=value"}, {"train.max_steps"});
  expect_error("", {"expected section.key=value"}, {"max_steps=3"});
  expect_error("", {"unknown key 'train.max_stepz'", "keys of 'train' are"}, {"train.max_stepz=3"});
  expect_error("", {"unknown key 'trian.max_steps'", "sections are"}, {"trian.max_steps=3"});
  expect_error("", {"train.max_steps", "--set", "expected an integer", "\"ten\""},
               {"train.max_steps=ten"});
}

TEST(ConfigErrors, UnknownKeyNamesKeyAndLine) {
  expect_error("run:\n  name: x\nmodel:\n  hidden_size: 64\n  hiden_layers: 2\n",
               {"unknown key 'model.hiden_layers'", "test.yaml line 5", "num_hidden_layers"});
  expect_error("model:\n  hidden_size: 64\nmodle:\n  x: 1\n",
               {"unknown section 'modle'", "line 3"});
}

TEST(ConfigErrors, WrongTypeNamesKeyAndLine) {
  expect_error("model:\n  hidden_size: abc\n",
               {"model.hidden_size", "test.yaml line 2", "expected an integer", "\"abc\""});
  expect_error("model:\n  hidden_size: 64.5\n", {"model.hidden_size", "expected an integer"});
  expect_error("model:\n  use_moe: 3\n", {"model.use_moe", "line 2", "true or false"});
  expect_error("model:\n  rope_theta: big\n", {"model.rope_theta", "expected a number"});
  expect_error("train:\n  batch_size: [1, 2]\n", {"train.batch_size", "line 2", "a list"});
  expect_error("model: 5\n", {"section 'model'", "line 1", "mapping"});
  expect_error("- a\n- b\n", {"top level must be a mapping"});
}

TEST(ConfigErrors, InvalidValuesNameKeyAndLine) {
  expect_error(
      "model:\n  hidden_size: 100\n  num_attention_heads: 3\n",
      {"model.hidden_size", "test.yaml line 2", "not divisible by model.num_attention_heads"});
  expect_error(
      "model:\n  num_attention_heads: 8\n  num_key_value_heads: 3\n",
      {"model.num_attention_heads", "line 2", "not divisible by model.num_key_value_heads"});
  expect_error("model:\n  use_moe: true\n  num_experts: 2\n  num_experts_per_tok: 3\n",
               {"model.num_experts_per_tok", "line 4", "more than model.num_experts"});
  expect_error("model:\n  hidden_size: 0\n",
               {"model.hidden_size", "line 2", "must be from 1 to 65536, got 0"});
  expect_error("model:\n  num_hidden_layers: -2\n",
               {"model.num_hidden_layers", "must be from 1 to 1024"});
  expect_error("model:\n  intermediate_size: 0\n", {"model.intermediate_size", "must be from 1"});
  expect_error("model:\n  num_experts: 0\n", {"model.num_experts", "must be from 1 to 4096"});
  // Every size key has an upper bound (docs/configuration.md, "Ranges").
  for (const auto& [key, max] : std::vector<std::pair<std::string, int64_t>>{
           {"model.hidden_size", kMaxSize.hidden},
           {"model.num_hidden_layers", kMaxSize.layers},
           {"model.num_attention_heads", kMaxSize.heads},
           {"model.num_key_value_heads", kMaxSize.heads},
           {"model.max_position_embeddings", kMaxSize.positions},
           {"model.vocab_size", kMaxSize.vocab},
           {"model.intermediate_size", kMaxSize.ffn},
           {"model.moe_intermediate_size", kMaxSize.ffn},
           {"model.num_experts", kMaxSize.experts},
           {"model.n_shared_experts", kMaxSize.experts},
           {"data.max_seq_len", kMaxSize.positions},
           {"train.batch_size", kMaxSize.batch}})
    expect_error("run: {name: x}\n",
                 {key, std::to_string(max) + ", got " + std::to_string(max + 1)},
                 {key + "=" + std::to_string(max + 1)});
  expect_error("model:\n  vocab_size: 2\n", {"model.vocab_size", ">= 3"});
  expect_error("model:\n  hidden_size: 24\n  num_attention_heads: 8\n  num_key_value_heads: 4\n",
               {"head_dim", "even"});
  expect_error("model:\n  dropout: 1.5\n", {"model.dropout", "[0, 1)"});
  expect_error("model:\n  hidden_act: gelu\n", {"model.hidden_act", "silu"});
  expect_error("model:\n  router_aux_loss_coef: -1\n", {"model.router_aux_loss_coef", ">= 0"});
  expect_error("data:\n  mode: stream\n", {"data.mode", "line 2", "pack"});
  // train.freeze: list keys in a file, refused names said with the key's line.
  expect_error("train:\n  freeze: [experts, brain]\n",
               {"train.freeze", "line 2", "unknown group \"brain\"", "shared_experts"});
  expect_error("train:\n  freeze: [router]\n", {"train.freeze", "no router", "use_moe"});
  expect_error("model:\n  use_moe: true\ntrain:\n  freeze: [shared_experts]\n",
               {"train.freeze", "n_shared_experts is 0"});
  expect_error("train:\n  freeze: [norms, norms]\n", {"train.freeze", "named twice"});
  expect_error("train:\n  freeze: [attention, embeddings, norms, experts]\n",
               {"train.freeze", "every parameter"});
  expect_error("train:\n  freeze: {router: 1}\n", {"train.freeze", "a list of names"});
  expect_error("", {"train.freeze", "unknown group \"brain\""}, {"train.freeze=[brain]"});
  {
    // --set's list form, one name, and the resolved config's YAML reading back the same.
    Config cfg = load_config_string("model:\n  use_moe: true\n", "t");
    apply_override(cfg, "train.freeze=[router, shared_experts]");
    EXPECT_EQ(cfg.train.freeze, (std::vector<std::string>{"router", "shared_experts"}));
    apply_override(cfg, "train.freeze=router");
    EXPECT_EQ(cfg.train.freeze, (std::vector<std::string>{"router"}));
    validate_and_resolve(cfg);
    EXPECT_EQ(load_config_string(config_to_yaml(cfg), "again").train.freeze, cfg.train.freeze);
    apply_override(cfg, "train.freeze=[]");
    EXPECT_TRUE(cfg.train.freeze.empty());
  }
  expect_error("data:\n  mode: pad\n  sft_packing: true\n",
               {"data.sft_packing", "line 3", "data.mode sft", "\"pad\""});
  expect_error("data:\n  max_seq_len: 70000\n", {"data.max_seq_len", "max_position_embeddings"});
  // pack rows are max_seq_len + 1 long; pad rows max_seq_len.
  expect_error("model:\n  max_position_embeddings: 64\ndata:\n  max_seq_len: 64\n",
               {"data.max_seq_len", "line 4", "pack mode needs max_seq_len + 1"});
  EXPECT_EQ(
      error_of("model:\n  max_position_embeddings: 64\ndata:\n  max_seq_len: 64\n  mode: pad\n"),
      "");
  expect_error("data:\n  strict: maybe\n", {"data.strict", "true or false"});
  expect_error("data:\n  cache_dir: ''\n", {"data.cache_dir", "directory"});
  expect_error("train:\n  learning_rate: 0\n", {"train.learning_rate", "> 0"});
  expect_error("train:\n  max_steps: 10\n  warmup_steps: 10\n",
               {"train.warmup_steps", "less than"});
  expect_error("run:\n  name: a/b\n", {"run.name", "slashes"});
  // A default that becomes invalid through another key says "default".
  expect_error("model:\n  num_attention_heads: 5\n  num_key_value_heads: 5\n",
               {"model.hidden_size (default)"});
}

// The balancing lab's keys: defaults are MiniMind-3's; each bad value names key and line; a
// pair that cannot work names both keys.
TEST(ConfigBalancing, DefaultsAreMiniMind3) {
  Config cfg = load_config_string("", "empty.yaml");
  const ModelConfig& m = cfg.model;
  EXPECT_EQ(m.aux_loss_scope, AuxScope::batch);
  EXPECT_EQ(m.router_z_loss_coef, 0.0);
  EXPECT_EQ(m.scoring_func, ScoringFunc::softmax);
  EXPECT_EQ(m.router_bias_update_rate, 0.0);
  EXPECT_EQ(m.capacity_factor, 0.0);
  EXPECT_EQ(m.capacity_drop_policy, DropPolicy::probs);
  EXPECT_EQ(m.n_shared_experts, 0);
  EXPECT_FALSE(m.shared_expert_intermediate_size.has_value());
  EXPECT_EQ(m.router, RouterKind::learned);
  // A shared expert's width defaults to the routed experts'.
  LoadedConfig shared = load_config(shipped("moe-deepseek.yaml"), {});
  EXPECT_EQ(*shared.config.model.shared_expert_intermediate_size, 112);
}

TEST(ConfigBalancing, BadValuesAndCombinationsNameTheKeys) {
  const std::string moe = "model:\n  use_moe: true\n";
  expect_error(moe + "  aux_loss_scope: token\n",
               {"model.aux_loss_scope", "line 3", "\"batch\", \"sequence\", \"global\""});
  expect_error(moe + "  scoring_func: tanh\n", {"model.scoring_func", "line 3", "sigmoid"});
  expect_error(moe + "  router: expert_choice\n", {"model.router", "line 3", "hash"});
  expect_error(moe + "  capacity_factor: 1.0\n  capacity_drop_policy: random\n",
               {"model.capacity_drop_policy", "line 4", "position"});
  expect_error(moe + "  capacity_factor: -1\n", {"model.capacity_factor", ">= 0"});
  expect_error(moe + "  router_z_loss_coef: .nan\n", {"model.router_z_loss_coef", "line 3"});
  expect_error(moe + "  router_z_loss_coef: -0.5\n", {"model.router_z_loss_coef", ">= 0"});
  expect_error(moe + "  router_bias_update_rate: -0.001\n",
               {"model.router_bias_update_rate", ">= 0"});
  expect_error(moe + "  n_shared_experts: -1\n", {"model.n_shared_experts", ">= 0"});
  // A finite range: 1e308 used to be taken, and the NaN it made blamed on the learning rate.
  expect_error(moe + "  routed_scaling_factor: 1.0e308\n",
               {"model.routed_scaling_factor", "must be in [0.001, 1000], got 1e+308"});
  expect_error(moe + "  n_shared_experts: 1\n  shared_expert_intermediate_size: 0\n",
               {"model.shared_expert_intermediate_size", "must be from 1 to"});
  // Combinations: both keys, both origins.
  expect_error("model:\n  n_shared_experts: 1\n", {"model.n_shared_experts (test.yaml line 2)",
                                                   "model.use_moe (default)", "use_moe: false"});
  expect_error(
      moe +
          "  router: random\n  router_bias_update_rate: 0.001\n  "
          "router_aux_loss_coef: 0\n",
      {"model.router_bias_update_rate (test.yaml line 4)", "model.router (test.yaml line 3)"});
  expect_error(moe + "  router: hash\n", {"model.router_aux_loss_coef (default)",
                                          "model.router (test.yaml line 3)", "set it to 0"});
  expect_error(
      moe + "  router: hash\n  router_aux_loss_coef: 0\n  num_experts_per_tok: 2\n",
      {"model.num_experts_per_tok (test.yaml line 5)", "model.router", "exactly one expert"});
  expect_error(moe + "  router: random\n  router_aux_loss_coef: 0\n  capacity_factor: 1.25\n",
               {"model.capacity_factor", "model.router"});
  expect_error(moe + "  shared_expert_intermediate_size: 64\n",
               {"model.shared_expert_intermediate_size", "model.n_shared_experts"});
  // Quantile balancing: what Megatron-LM forbids with it, and the histogram's range.
  const std::string qb = moe + "  router_bias_rule: quantile\n  router_aux_loss_coef: 0\n";
  expect_error(moe + "  router_bias_rule: quantile\n",
               {"model.router_aux_loss_coef (default)", "model.router_bias_rule (test.yaml line 3)",
                "Megatron-LM", "#5349"});
  expect_error(qb + "  capacity_factor: 1.25\n", {"model.capacity_factor (test.yaml line 5)",
                                                  "model.router_bias_rule", "capacity dropping"});
  expect_error(qb + "  scoring_func: sqrtsoftplus\n",
               {"model.qb_estimator (default)", "model.scoring_func (test.yaml line 5)",
                "unbounded", "qb_estimator: exact"});
  expect_error(qb + "  router_bias_update_rate: 0.001\n",
               {"model.router_bias_update_rate (test.yaml line 5)", "model.router_bias_rule"});
  expect_error(qb + "  num_experts: 2\n  num_experts_per_tok: 2\n",
               {"model.num_experts_per_tok (test.yaml line 6)", "(k+1)-th"});
  expect_error(qb + "  qb_num_bins: 1\n", {"model.qb_num_bins", "must be from 2 to 100000"});
  expect_error(qb + "  qb_num_bins: 2147483647\n",
               {"model.qb_num_bins", "must be from 2 to 100000, got 2147483647"});
  expect_error(qb + "  qb_ema: 1.0\n", {"model.qb_ema", "[0, 1)"});
  expect_error(moe + "  qb_estimator: exact\n",
               {"model.qb_estimator (test.yaml line 3)", "model.router_bias_rule (default)",
                "router_bias_rule: quantile"});
  expect_error(moe + "  router_bias_rule: median\n",
               {"model.router_bias_rule", "line 3", "\"sign\", \"quantile\""});
  EXPECT_EQ(error_of(qb + "  scoring_func: sqrtsoftplus\n  qb_estimator: exact\n  qb_ema: 0.5\n"),
            "");
  // Hash-routed layers: fewer than the MoE layers, on the learned router.
  expect_error(moe + "  num_hidden_layers: 2\n  hash_layers: 2\n",
               {"model.hash_layers (test.yaml line 4)",
                "model.num_hidden_layers (test.yaml line 3)", "leave none that learns"});
  expect_error(moe + "  hash_layers: -1\n", {"model.hash_layers", ">= 0"});
  expect_error(moe + "  hash_table: random\n",
               {"model.hash_table (test.yaml line 3)", "model.hash_layers (default)"});
  expect_error("model:\n  hash_layers: 1\n", {"model.hash_layers", "model.use_moe"});
  expect_error(moe + "  router: hash\n  router_aux_loss_coef: 0\n  hash_layers: 1\n",
               {"model.hash_layers (test.yaml line 5)", "model.router (test.yaml line 3)"});
  EXPECT_EQ(error_of(moe + "  hash_layers: 1\n  hash_table: random\n  num_experts_per_tok: 2\n"),
            "");
  // Sound combinations pass; the control routers work with shared experts and pad mode.
  EXPECT_EQ(error_of(moe + "  router: hash\n  router_aux_loss_coef: 0\n  n_shared_experts: 1\n"
                           "data:\n  mode: pad\n"),
            "");
}

TEST(ConfigBalancing, QuestionablePairsWarnAndSayWhy) {
  auto warnings = [](const std::vector<std::string>& sets) {
    return load_config(shipped("moe.yaml"), sets).warnings;
  };
  auto has = [](const std::vector<std::string>& w, const std::string& part) {
    for (const auto& x : w)
      if (x.find(part) != std::string::npos) return true;
    return false;
  };
  // Megatron refuses the bias with softmax scoring; we warn and say why.
  auto w = warnings({"model.router_bias_update_rate=0.001"});
  EXPECT_TRUE(has(w, "Megatron refuses")) << (w.empty() ? "" : w[0]);
  EXPECT_FALSE(has(warnings({"model.router_bias_update_rate=0.001", "model.scoring_func=sigmoid"}),
                   "Megatron"));
  EXPECT_TRUE(has(warnings({"model.router_aux_loss_coef=0", "model.aux_loss_scope=global"}),
                  "no aux loss to scope"));
  EXPECT_TRUE(has(warnings({"model.capacity_drop_policy=position"}), "no effect"));
  // Quantile balancing over softmax scores is this lab's extension; top-1 renormalised with
  // no router loss leaves the router's weights where they started (MiniMind #858).
  const std::vector<std::string> qb = {"model.router_bias_rule=quantile",
                                       "model.router_aux_loss_coef=0"};
  EXPECT_TRUE(has(warnings(qb), "lab's extension"));
  std::vector<std::string> qb_sigmoid = qb;
  qb_sigmoid.push_back("model.scoring_func=sigmoid");
  EXPECT_FALSE(has(warnings(qb_sigmoid), "extension"));
  EXPECT_FALSE(has(warnings(qb_sigmoid), "no gradient at all"));
  qb_sigmoid.push_back("model.norm_topk_prob=true");
  EXPECT_TRUE(has(warnings(qb_sigmoid), "no gradient at all"));
  EXPECT_TRUE(warnings({}).empty());
  for (const char* preset : {"moe-switch.yaml", "moe-deepseek.yaml", "minimind2-moe.yaml"})
    EXPECT_TRUE(load_config(shipped(preset), {}).warnings.empty()) << preset;
}

TEST(ConfigErrors, DuplicatesAndBadYaml) {
  expect_error("model:\n  hidden_size: 64\n  hidden_size: 128\n",
               {"'model.hidden_size' appears twice", "line 3"});
  expect_error("model:\n  hidden_size: 64\nmodel:\n  use_moe: true\n",
               {"section 'model' appears twice"});
  expect_error("model:\n  hidden_size: [64\n", {"invalid YAML", "test.yaml line"});
  // What follows a second document's `---` would be ignored unread: refused, with its line.
  expect_error("model:\n  hidden_size: 64\n---\nmodel:\n  hidden_size: 32\n",
               {"test.yaml line 3", "a second YAML document"});
  expect_error("model:\n  hidden_size: 64\n---\n", {"a second YAML document"});
  expect_error("model:\n  hidden_size: 64\n...\nrun: {seed: 1}\n", {"test.yaml line 4"});
  // An explicit start, comments and directives are one document.
  EXPECT_EQ(error_of("%YAML 1.2\n---\n# c\nmodel:\n  hidden_size: 64\n...\n# end\n"), "");
  EXPECT_EQ(error_of("--- {model: {hidden_size: 64}}\n"), "");
  // Found by fuzz_config: yaml-cpp 0.7's LoadAll never returned on this text (a plain
  // scalar: one document, which sets no key). Reading it must return; ctest's timeout
  // fails the test otherwise.
  EXPECT_EQ(error_of("# c\n\n, with\n# c\nm_ MinliMind; see moe.:yaml for the fix\n"), "");
}

// run.name names runs/<name>: never a path, "." or "..", which would make the run directory
// runs/ itself or the working directory.
TEST(ConfigErrors, RunNameIsANameNotAPath) {
  for (const char* name : {"..", ".", "a/b", "", "a b"}) {
    SCOPED_TRACE(name);
    expect_error("run:\n  name: \"" + std::string(name) + "\"\n",
                 {"run.name", "other than . and .."});
  }
  EXPECT_EQ(error_of("run:\n  name: \"..moe\"\n"), "");
}

// Inputs named in a config file are read from the file's directory; --set values and outputs
// from the working directory.
TEST(ConfigFile, RelativeDataPathsAreReadFromTheFilesDirectory) {
  const std::string dir = test::temp_dir("relpaths");
  test::write_text(dir + "/exp.yaml",
                   "data:\n  train: corpus/a.jsonl\n  val: /abs/b.jsonl\n  tokenizer: ../t.model\n"
                   "  cache_dir: cache\n");
  const Config cfg = load_config_file(dir + "/exp.yaml");
  EXPECT_EQ(cfg.data.train, dir + "/corpus/a.jsonl");
  EXPECT_EQ(cfg.data.val, "/abs/b.jsonl");
  EXPECT_EQ(cfg.data.tokenizer, std::filesystem::path(dir).parent_path().string() + "/t.model");
  EXPECT_EQ(cfg.data.cache_dir, "cache");
  const LoadedConfig set = load_config(dir + "/exp.yaml", {"run.name=x", "data.train=mine.jsonl"});
  EXPECT_EQ(set.config.data.train, "mine.jsonl");
}

TEST(ConfigFile, PresetsAreFoundByName) {
  const std::string moe = test::source_path("configs/moe.yaml");
  EXPECT_EQ(std::filesystem::canonical(find_config_file("moe")), std::filesystem::canonical(moe));
  EXPECT_EQ(std::filesystem::canonical(find_config_file("moe.yaml")),
            std::filesystem::canonical(moe));
  EXPECT_EQ(find_config_file(moe), moe);  // a path is taken as it is
  // The preset's corpus is the shipped one, wherever the program runs.
  EXPECT_EQ(std::filesystem::canonical(load_config_file(find_config_file("moe")).data.train),
            std::filesystem::canonical(test::source_path("data/austen.jsonl")));
  const std::string err = test::error_of<ConfigError>([] { find_config_file("mo"); });
  EXPECT_NE(err.find("no preset of that name"), std::string::npos) << err;
  EXPECT_NE(
      err.find("dense, minimind-3-moe, minimind-3, minimind2-moe, moe-deepseek, moe-switch, moe"),
      std::string::npos)
      << err;
  EXPECT_NE(test::error_of<ConfigError>([] {
              find_config_file("configs/mo.yaml");
            }).find("no config file 'configs/mo.yaml'"),
            std::string::npos);
}

// A size no machine has is refused, naming the keys (the estimate itself is checked against
// the built model in model_tests).
TEST(ConfigMemory, AbsurdModelSizesAreRefused) {
  Config cfg = load_config_string("run: {name: defaults}\n", "test.yaml");
  validate_and_resolve(cfg);
  EXPECT_NO_THROW(check_model_fits_memory(cfg.model, true));
  cfg.model.num_hidden_layers = 100000000;
  try {
    check_model_fits_memory(cfg.model, true);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.num_hidden_layers (100000000)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("GB to train"), std::string::npos) << e.what();
  }
}

// The estimate's other parts, worked out by hand: quantile balancing's histograms ((L + 6)
// [E, bins] int64 tables), the hash layers' [V, k] tables, and a micro-batch's activations
// (per token and layer 8 H + 2 heads T + 4 (k I_e + n_s I_s + 3 E) floats, and 3 V for the
// logits; every layer's in training, one layer's in evaluation).
TEST(ConfigMemory, HistogramsTablesAndActivationsEnterTheEstimate) {
  ModelConfig m;
  m.hidden_size = 16, m.num_hidden_layers = 64, m.num_attention_heads = 2,
  m.num_key_value_heads = 1, m.vocab_size = 100, m.intermediate_size = 16, m.use_moe = true,
  m.num_experts = 4096, m.num_experts_per_tok = 2, m.moe_intermediate_size = 16;
  const double base = memory_estimate(m, true).routing;
  EXPECT_EQ(base, 0.0);
  m.router_bias_rule = BiasRule::quantile, m.qb_num_bins = 100000;
  EXPECT_EQ(memory_estimate(m, true).routing, 70.0 * 4096 * 100000 * 8);
  EXPECT_EQ(memory_estimate(m, false).routing, 0.0);  // the histograms are training's
  m.hash_layers = 3;
  EXPECT_EQ(memory_estimate(m, false).routing, 3.0 * 100 * 2 * 8);
  const std::string err =
      test::error_of<ConfigError>([&] { check_model_fits_memory(m, true, 1, 8); });
  EXPECT_NE(err.find("most of it is the routing tables"), std::string::npos) << err;
  EXPECT_NE(err.find("model.qb_num_bins"), std::string::npos) << err;
  // Activations: 2 rows of 8 tokens; per layer 8*16 + 2*2*8 + 4*(2*16 + 0 + 3*4096) floats.
  const double per_layer = 8 * 16 + 2 * 2 * 8 + 4 * (2 * 16 + 3 * 4096);
  EXPECT_EQ(memory_estimate(m, true, 2, 8).activations, 4.0 * 16 * (64 * per_layer + 3 * 100));
  EXPECT_EQ(memory_estimate(m, false, 2, 8).activations, 4.0 * 16 * (per_layer + 3 * 100));
  const std::string batch =
      test::error_of<ConfigError>([&] { check_model_fits_memory(m, false, 1 << 20, 1 << 20); });
  EXPECT_NE(batch.find("most of it is the activations of a micro-batch of train.batch_size"),
            std::string::npos)
      << batch;
}

TEST(ConfigFile, MissingFileIsAnError) {
  try {
    load_config_file("/nonexistent/x.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.yaml"), std::string::npos);
  }
}

TEST(ConfigRoundTrip, WrittenYamlLoadsBackIdentically) {
  for (const char* name : {"moe.yaml", "dense.yaml", "minimind-3-moe.yaml"}) {
    SCOPED_TRACE(name);
    LoadedConfig c = load_config(shipped(name), {"data.val=with space: and \"quotes\""});
    const std::string yaml = config_to_yaml(c.config);
    Config back = load_config_string(yaml, "resolved.yaml");
    validate_and_resolve(back);
    EXPECT_EQ(config_to_yaml(back), yaml);
    EXPECT_EQ(back.data.val, "with space: and \"quotes\"");
    EXPECT_EQ(back.model.router_aux_loss_coef, c.config.model.router_aux_loss_coef);
    EXPECT_EQ(back.train.eps, c.config.train.eps);
    EXPECT_EQ(*back.model.intermediate_size, *c.config.model.intermediate_size);
  }
}

// --print-config's output read back as a config warns about nothing the original did not.
TEST(ConfigRoundTrip, APrintedConfigLoadsWithoutNewWarnings) {
  for (const auto& [name, path] : list_presets()) {
    SCOPED_TRACE(name);
    const LoadedConfig original = load_config(path, {});
    const std::string printed = test::temp_dir("printed") + "/printed.yaml";
    test::write_text(printed, config_to_yaml(original.config));
    EXPECT_EQ(load_config(printed, {}).warnings, original.warnings);
  }
}

TEST(ConfigFile, AnEmptyFileIsRefusedUnlessTheRunIsNamed) {
  const std::string path = test::temp_dir("emptycfg") + "/empty.yaml";
  test::write_text(path, "# nothing here\n");
  const std::string msg = test::error_of<ConfigError>([&] { load_config(path, {}); });
  EXPECT_NE(msg.find("'" + path + "' sets no key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: start from a preset"), std::string::npos) << msg;
  EXPECT_EQ(load_config(path, {"run.name=defaults"}).config.model.hidden_size, 768);
}

// A run's config.yaml is read by users' Python notebooks too: PyYAML (YAML 1.1) must see the
// same numbers, e.g. rms_norm_eps 1.0e-06 rather than the string "1e-06".
TEST(ConfigRoundTrip, PythonYamlReadsTheSameValues) {
  Config cfg = load_config(test::source_path("configs/moe.yaml"), {"train.eps=1e-8"}).config;
  const std::string dir = test::temp_dir("pyyaml");
  test::write_text(dir + "/config.yaml", config_to_yaml(cfg));
  const std::string check =
      std::string(MINIMIND_PYTHON) +
      " -c \"import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); "
      "sys.exit(0 if d['model']['rms_norm_eps'] == 1e-06 and "
      "d['train']['eps'] == 1e-08 and d['model']['rope_theta'] == 1e6 and "
      "all(not isinstance(v, str) or k in ('name', 'hidden_act', 'train', "
      "'val', 'tokenizer', 'mode', 'cache_dir', 'aux_loss_scope', 'scoring_func', "
      "'capacity_drop_policy', 'router', 'console', 'precision', 'matmul', 'init_from', "
      "'init_mode', 'router_bias_rule', 'qb_estimator', 'hash_table') "
      "for s in "
      "d.values() for "
      "k, v in s.items()) else 1)\" " +
      dir + "/config.yaml";
  EXPECT_EQ(std::system(check.c_str()), 0) << config_to_yaml(cfg);
  EXPECT_EQ(config_to_yaml(load_config_string(config_to_yaml(cfg), "back")), config_to_yaml(cfg));
}

// Found by fuzz_config: a key that is not a plain word (here a null key, "? # comment")
// threw yaml-cpp's bad conversion instead of a config error.
TEST(ConfigErrors, KeysThatAreNotWordsAreConfigErrors) {
  std::string msg = test::error_of<ConfigError>([] {
    load_config_string("model:\n  hidden_size: 64\n  ? # a comment\n  use_moe: false\n", "k.yaml");
  });
  EXPECT_NE(msg.find("a key of section 'model' must be a plain word"), std::string::npos) << msg;
  msg = test::error_of<ConfigError>([] { load_config_string("[run, model]: 1\n", "k.yaml"); });
  EXPECT_NE(msg.find("a section name must be a plain word"), std::string::npos) << msg;
}

// base: a file states only how it differs from another; the resolved whole is the base's
// values with the file's on top, origins naming the file each value came from.
TEST(ConfigBase, AFileStartsFromItsBase) {
  const std::string dir = test::temp_dir("base");
  std::filesystem::create_directories(dir + "/sub");
  test::write_text(dir + "/a.yaml",
                   "run: {name: a}\nmodel: {hidden_size: 64, use_moe: true, num_experts: 8}\n"
                   "data: {train: corpus.jsonl}\n");
  test::write_text(dir + "/sub/b.yaml", "base: ../a.yaml\nmodel:\n  num_experts: 16\n");
  const Config b = load_config_file(dir + "/sub/b.yaml");
  EXPECT_EQ(b.model.hidden_size, 64);
  EXPECT_EQ(b.model.num_experts, 16);
  EXPECT_EQ(b.data.train, dir + "/corpus.jsonl");  // relative to the base's directory
  EXPECT_EQ(b.run.name, "b");                      // not its base's run directory
  EXPECT_NE(b.origin.at("model.num_experts").find("b.yaml line 3"), std::string::npos);
  EXPECT_NE(b.origin.at("model.hidden_size").find("a.yaml line 2"), std::string::npos);
  // A shipped preset by name when no such file is beside this one.
  test::write_text(dir + "/mine.yaml", "base: moe\nmodel: {num_experts: 8}\n");
  const Config mine = load_config_file(dir + "/mine.yaml");
  EXPECT_EQ(mine.model.num_experts, 8);
  EXPECT_EQ(mine.model.hidden_size, 128);  // moe.yaml's
  EXPECT_EQ(mine.run.name, "mine");
  // A base of a base; the shipped variants resolve to their base plus their own keys.
  test::write_text(dir + "/c.yaml", "base: sub/b.yaml\nrun: {name: c}\n");
  EXPECT_EQ(load_config_file(dir + "/c.yaml").model.num_experts, 16);
  for (const char* variant : {"moe-switch.yaml", "moe-deepseek.yaml", "minimind2-moe.yaml"}) {
    SCOPED_TRACE(variant);
    Config v = load_config_file(shipped(variant)), m = load_config_file(shipped("moe.yaml"));
    validate_and_resolve(v), validate_and_resolve(m);
    EXPECT_EQ(config_differences(m, v, "data"), std::vector<std::string>{});
    EXPECT_EQ(config_differences(m, v, "train"), std::vector<std::string>{});
    EXPECT_FALSE(config_differences(m, v, "model").empty());
  }
}

TEST(ConfigBase, MissingBaseCycleAndBadValueAreErrors) {
  const std::string dir = test::temp_dir("base_errors");
  auto error = [](const std::string& path) {
    return test::error_of<ConfigError>([&] { load_config_file(path); });
  };
  test::write_text(dir + "/missing.yaml", "run: {name: x}\nbase: nowhere.yaml\n");
  EXPECT_NE(error(dir + "/missing.yaml").find("base (" + dir + "/missing.yaml line 2)"),
            std::string::npos)
      << error(dir + "/missing.yaml");
  EXPECT_NE(error(dir + "/missing.yaml").find("nowhere.yaml"), std::string::npos);
  test::write_text(dir + "/x.yaml", "base: y.yaml\n");
  test::write_text(dir + "/y.yaml", "base: x.yaml\n");
  const std::string cycle = error(dir + "/x.yaml");
  EXPECT_NE(cycle.find("cycle"), std::string::npos) << cycle;
  EXPECT_NE(cycle.find("y.yaml"), std::string::npos) << cycle;
  test::write_text(dir + "/self.yaml", "base: self.yaml\n");
  EXPECT_NE(error(dir + "/self.yaml").find("cycle"), std::string::npos);
  test::write_text(dir + "/twice.yaml", "base: moe.yaml\nbase: dense.yaml\n");
  EXPECT_NE(error(dir + "/twice.yaml").find("'base' appears twice (" + dir + "/twice.yaml line 2)"),
            std::string::npos)
      << error(dir + "/twice.yaml");
  test::write_text(dir + "/list.yaml", "base: [a.yaml]\n");
  EXPECT_NE(error(dir + "/list.yaml").find("expected the file name"), std::string::npos);
  // A config that is not a file (a checkpoint's stored config) has nothing to start from.
  EXPECT_NE(error_of("base: moe.yaml\n").find("only a config file"), std::string::npos);
}

// A choice is parsed once, by name: a misspelt value never reaches the model's code.
TEST(ConfigBalancing, ChoicesRoundTripByName) {
  Config cfg = load_config_string(
      "model: {use_moe: true, aux_loss_scope: global, scoring_func: sigmoid, router: hash,\n"
      "        capacity_drop_policy: position, router_aux_loss_coef: 0, num_experts_per_tok: 1}\n",
      "choices.yaml");
  EXPECT_EQ(cfg.model.aux_loss_scope, AuxScope::global);
  EXPECT_EQ(cfg.model.scoring_func, ScoringFunc::sigmoid);
  EXPECT_EQ(cfg.model.router, RouterKind::hash);
  EXPECT_EQ(cfg.model.capacity_drop_policy, DropPolicy::position);
  const Config again = load_config_string(config_to_yaml(cfg), "again.yaml");
  EXPECT_EQ(config_differences(cfg, again), std::vector<std::string>{});
  expect_error("model:\n  router: Learned\n", {"model.router", "line 2", "\"learned\""});
  expect_error("", {"model.scoring_func", "--set", "\"softmax\", \"sigmoid\""},
               {"model.scoring_func=relu"});
}

TEST(ConfigExpertParallel, MustDivideTheExpertsOfAMoEModel) {
  expect_error(
      "run:\n  expert_parallel: 3\nmodel:\n  use_moe: true\n  num_experts: 4\n",
      {"run.expert_parallel (test.yaml line 2)", "must divide model.num_experts = 4", "got 3"});
  expect_error("run:\n  expert_parallel: 2\n", {"run.expert_parallel", "needs model.use_moe"});
  expect_error("run:\n  expert_parallel: 0\n", {"run.expert_parallel"});
  EXPECT_EQ(error_of("run:\n  expert_parallel: 2\nmodel:\n  use_moe: true\n  num_experts: 4\n"),
            "");
}
