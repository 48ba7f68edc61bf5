// Run configuration: plain structs with MiniMind's defaults, parsed once from YAML
// (config_yaml.cpp) and validated once (config.cpp). This is the only place defaults live.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "minimind/choices.h"
#include "minimind/error.h"

namespace minimind {

// More threads than this is a typo, not a machine (run.threads and the tools' --threads).
constexpr int64_t kMaxThreads = 1024;

struct RunConfig {
  std::string name = "minimind";
  int64_t seed = 1337;
  int64_t threads = 0;  // 0: one per core (per rank: cores / LOCAL_WORLD_SIZE)
  // Multi-process runs: seconds a rank waits for the others (start-up, each collective)
  // before the job stops with an error naming the failed step.
  int64_t dist_timeout = 600;
  // The matrix products (docs/precision.md): bf16 inputs with fp32 accumulation, or fp32.
  // A resumed run keeps its precision.
  Precision precision = Precision::fp32;
  // bf16 on a CPU without bf16 instructions: oneDNN emulates them, several times slower
  // than fp32; refused unless this is true.
  bool bf16_emulation = false;
  MatmulBackend matmul = MatmulBackend::automatic;  // the fp32 products' library
  // Expert parallelism: each MoE layer's routed experts spread over this many ranks, which
  // exchange token rows all-to-all (docs/distributed.md). Divides the ranks and the experts.
  int64_t expert_parallel = 1;
};

// Field names and defaults are MiniMind's MiniMindConfig (docs/minimind-spec.md).
struct ModelConfig {
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 8;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 4;
  int64_t vocab_size = 6400;
  int64_t max_position_embeddings = 32768;
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  std::optional<int64_t> intermediate_size;  // unset: ceil(hidden_size * pi / 64) * 64
  double dropout = 0.0;
  bool tie_word_embeddings = true;
  bool use_moe = false;
  int64_t num_experts = 4;
  int64_t num_experts_per_tok = 1;
  std::optional<int64_t> moe_intermediate_size;  // unset: = intermediate_size
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 5e-4;
  // The balancing lab (docs/moe-routing.md, "Balancing methods, exactly"). Every default
  // keeps MiniMind-3's routing float for float.
  AuxScope aux_loss_scope = AuxScope::batch;
  double router_z_loss_coef = 0.0;                  // ST-MoE router z-loss, per layer
  double router_importance_loss_coef = 0.0;         // Shazeer et al. 2017: CV² of the gate sums
  ScoringFunc scoring_func = ScoringFunc::softmax;  // sigmoid: DeepSeek-V3; sqrtsoftplus: V4
  double routed_scaling_factor = 1.0;    // the routed experts' weights times this (V4: 1.5)
  double router_bias_update_rate = 0.0;  // aux-loss-free bias: u of the sign update
  // quantile: the bias is replaced once per step by the quantile that gives each expert
  // its balanced share of the step's tokens (quantile balancing, torchtitan / Megatron-LM).
  BiasRule router_bias_rule = BiasRule::sign;
  QbEstimator qb_estimator = QbEstimator::histogram;
  int64_t qb_num_bins = 1000;  // the histogram's bins over [min b - 1, max b + 1]
  double qb_ema = 0.0;         // Megatron #5349: b = ema * b_old + (1 - ema) * b_solved
  // The first hash_layers MoE layers choose experts by a fixed token-id table (DeepSeek-V4's
  // hash layers); their learned gate gives only the mixing weights.
  int64_t hash_layers = 0;
  HashTable hash_table = HashTable::round_robin;
  double capacity_factor = 0.0;  // 0: dropless; else C = ceil(cf * k * T / E)
  DropPolicy capacity_drop_policy = DropPolicy::probs;
  int64_t n_shared_experts = 0;                            // always-on experts (DeepSeekMoE)
  std::optional<int64_t> shared_expert_intermediate_size;  // unset: = moe_intermediate_size
  RouterKind router = RouterKind::learned;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Resolved widths (valid on any config, resolved or not).
  int64_t ffn_size() const;
  int64_t expert_ffn_size() const;
  int64_t shared_ffn_size() const;
  bool learned_router() const { return router == RouterKind::learned; }
  // A selection bias e_score_correction_bias (sign step or quantile balancing).
  bool selection_bias() const {
    return router_bias_update_rate > 0 || router_bias_rule == BiasRule::quantile;
  }
};

// MiniMind's derived FFN width: ceil(hidden * pi / 64) * 64 (768 -> 2432).
int64_t default_intermediate_size(int64_t hidden_size);

// Bytes a model takes before it sees data: float32 weights (four times that when training:
// gradients and AdamW's two moments) and the RoPE tables. In doubles, so that absurd sizes
// do not wrap around.
double model_memory_bytes(const ModelConfig& m, bool training);
// The largest value of each size key (docs/configuration.md, "Ranges"): far above any
// model this tool trains on a CPU, and low enough that no product of sizes overflows.
struct MaxSizes {
  int64_t hidden = 65536, layers = 1024, heads = 1024, positions = 1 << 20, vocab = 1 << 24,
          ffn = 1 << 20, experts = 4096, qb_bins = 100000, batch = 1 << 20;
};
inline constexpr MaxSizes kMaxSize{};

// What a run holds in memory at its peak, in bytes (doubles: absurd sizes do not wrap
// around). An estimate that errs large, for refusing configs that cannot fit and for the
// start-up line; docs/configuration.md ("Memory") gives the formulas.
struct MemoryEstimate {
  double weights = 0;      // model_memory_bytes: weights (training: + gradients, AdamW moments)
  double routing = 0;      // hash-layer tables; quantile balancing's histograms (training)
  double activations = 0;  // one micro-batch of `rows` x `seq_len` tokens through the model
  double total() const { return weights + routing + activations; }
};
MemoryEstimate memory_estimate(const ModelConfig& m, bool training, int64_t rows = 0,
                               int64_t seq_len = 0);
// ConfigError naming the keys behind the largest part when the estimate exceeds this
// machine's memory (a typo such as num_hidden_layers: 100000000 otherwise ends in the OOM
// killer, or in an allocation failure after the run directory was written).
void check_model_fits_memory(const ModelConfig& m, bool training, int64_t rows = 0,
                             int64_t seq_len = 0);

struct DataConfig {
  std::string train = "data/austen.jsonl";
  std::string val;  // empty: hold out val_fraction of train's records
  double val_fraction = 0.02;
  std::string tokenizer;      // empty: train a sentencepiece model from `train`
  int64_t max_seq_len = 340;  // MiniMind's pretraining default
  std::string mode = "pack";  // pack | pad | sft (chat data, docs/fine-tuning.md)
  // sft: MiniMind's augmentations, drawn from run.seed for each row: the share of rows of a
  // conversation without system turn or tools that get one of MiniMind's system prompts,
  // and the share that keep their empty think blocks (the others lose them).
  double add_system_ratio = 0.2;
  double empty_think_ratio = 0.2;
  // sft: conversations side by side in each row, each attending only to itself with its
  // positions from 0 (the loss of the same conversations padded; docs/fine-tuning.md).
  bool sft_packing = false;
  std::string cache_dir = "cache";  // prepared tokenizers and token files
  bool strict = false;              // bad corpus lines are errors instead of skipped records
};

// Defaults are MiniMind's train_pretrain.py (AdamW with torch defaults, clip 1.0).
struct TrainConfig {
  int64_t batch_size = 32;
  int64_t accumulation_steps = 8;
  int64_t max_steps = 1000;
  double learning_rate = 5e-4;
  int64_t warmup_steps = 0;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  int64_t eval_interval = 100;
  int64_t checkpoint_interval = 1000;
  int64_t keep_checkpoints = 3;
  // Weights to start from instead of random ones (with a fresh optimizer, step counter,
  // data position and schedule): a run directory (its newest checkpoint), a checkpoint
  // directory or a MiniMind .pth. "" = random initialisation from run.seed.
  std::string init_from;
  // How init_from's weights become this model's: "copy" (the same names and shapes) or
  // "upcycle" (a dense model's into an MoE one: every routed and shared expert starts as a
  // copy of the layer's dense feed-forward, the router from run.seed; weights_io.h).
  std::string init_mode = "copy";
  // Drop-Upcycling: the share of each expert's intermediate units re-initialised after
  // upcycling (0: plain copies; weights_io.h).
  double upcycle_drop = 0.0;
  // He et al. 2024's output scaling of upcycled experts: the feed-forward's output at tied
  // router scores equals the dense one (needed by fine-grained experts; weights_io.h).
  bool upcycle_scaling = false;
  // init_from with a data.tokenizer other than the one its weights were trained with (their
  // run's copy): refused unless this says it is meant (the weights' ids then mean other text).
  bool init_other_tokenizer = false;
  // Parameter groups that keep their values (fine-tuning): router, experts (a dense layer's
  // feed-forward too), shared_experts, attention, embeddings (and an untied lm_head), norms.
  // docs/fine-tuning.md, "What to train".
  std::vector<std::string> freeze;
};

struct LogConfig {
  int64_t interval = 100;
  // Collapse warning: a MoE layer whose top expert takes more than collapse_max_share of
  // the tokens, or with at least collapse_dead_experts experts that got none, for
  // collapse_patience consecutive log intervals.
  double collapse_max_share = 0.9;
  int64_t collapse_dead_experts = 1;
  int64_t collapse_patience = 3;
  // "Balanced but uninformative" warning: a layer whose routing information MI = H_m - H̄
  // (docs/moe-routing.md) stays below this for collapse_patience consecutive log intervals
  // after the warm-up (0 turns it off). 0.01: measured on configs/moe.yaml, where MiniMind
  // #858's routers stay at 0.001-0.007 and the shipped preset's at 0.011-0.39 after step 30.
  double uninformative_mi = 0.01;
  // What minimind-train prints per log interval: "compact" (lines of at most 120 columns:
  // losses, the load histogram, max share, MaxVio, entropy, dead experts and MI per layer)
  // or "full" (every metric of expert_load.jsonl's row, as minimind-eval inspect shows).
  std::string console = "compact";
  // Seconds between rewrites of RUN/report.html while the run trains (it is also rewritten
  // after every evaluation and at the end); 0: only at the end.
  int64_t report_interval = 300;
  // TensorBoard event files in RUN/tensorboard/ (scalars and expert-load histograms).
  bool tensorboard = false;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  LogConfig log;

  // Where each explicitly set key ("model.hidden_size") came from, e.g. "moe.yaml line 12"
  // or "--set model.hidden_size=64"; keys left at their default have no entry.
  std::map<std::string, std::string> origin;
};

// ---- The key table: one entry per YAML key, used for parsing, --set and writing back.
// Choices (choices.h) are parsed and written by their names.
// train.freeze's groups, in the order docs/fine-tuning.md lists them.
const std::vector<std::string>& freeze_groups();

using FieldRef =
    std::variant<int64_t*, double*, bool*, std::string*, std::optional<int64_t>*,
                 std::vector<std::string>*, AuxScope*, ScoringFunc*, BiasRule*, QbEstimator*,
                 HashTable*, DropPolicy*, RouterKind*, Precision*, MatmulBackend*>;

struct Field {
  const char* section;
  const char* key;
  FieldRef (*bind)(Config&);
  std::string path() const { return std::string(section) + "." + key; }
};

const std::vector<Field>& config_fields();

// ---- Finding a config (presets.cpp).
// The directory of the running program (for the files installed beside it).
std::string program_dir();
// Where the shipped presets are: the install's share/minimind/configs, the source tree's
// configs/; those that exist.
std::vector<std::string> preset_dirs();
// (name, path) of every preset, the first directory's winning a name.
std::vector<std::pair<std::string, std::string>> list_presets();
// A --config argument: the file when it exists, else the preset of that name ("moe" or
// "moe.yaml"); ConfigError listing the presets otherwise.
std::string find_config_file(const std::string& arg);

// ---- Parsing (config_yaml.cpp). All throw ConfigError.
// Relative data.train, data.val and data.tokenizer set in the file are read from the
// file's directory (a preset finds the shipped corpus from anywhere); values from --set
// and outputs (data.cache_dir, the run directory) stay relative to the working directory.
Config load_config_file(const std::string& path);
Config load_config_string(const std::string& yaml, const std::string& source_name);
// Applies one "section.key=value" override (value parsed as a YAML scalar).
void apply_override(Config& cfg, const std::string& assignment);
// The resolved config as YAML; loading it again gives the same Config.
std::string config_to_yaml(const Config& cfg);

// ---- Validation (config.cpp).
// Checks every value, fills derived sizes, returns warnings (e.g. MiniMind issue #858).
std::vector<std::string> validate_and_resolve(Config& cfg);

// (section.key, value as text) for every key, in the key table's order.
std::vector<std::pair<std::string, std::string>> config_values(const Config& cfg);

// "section.key: A -> B" for every key whose value differs (sections: all if empty).
std::vector<std::string> config_differences(const Config& a, const Config& b,
                                            const std::string& section = "");

// The usual entry point: file, then overrides, then validation.
struct LoadedConfig {
  Config config;
  std::vector<std::string> warnings;
};
LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace minimind
