// The key table and the validation of a parsed Config.
#include "minimind/config.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace minimind {

int64_t default_intermediate_size(int64_t hidden_size) {
  // MiniMind: math.ceil(hidden_size * math.pi / 64) * 64
  return static_cast<int64_t>(std::ceil(static_cast<double>(hidden_size) * M_PI / 64.0)) * 64;
}

int64_t ModelConfig::ffn_size() const {
  return intermediate_size ? *intermediate_size : default_intermediate_size(hidden_size);
}

int64_t ModelConfig::expert_ffn_size() const {
  return moe_intermediate_size ? *moe_intermediate_size : ffn_size();
}

int64_t ModelConfig::shared_ffn_size() const {
  return shared_expert_intermediate_size ? *shared_expert_intermediate_size : expert_ffn_size();
}

double model_memory_bytes(const ModelConfig& m, bool training) {
  const double H = static_cast<double>(m.hidden_size);
  const double kv = static_cast<double>(m.num_key_value_heads) * static_cast<double>(m.head_dim());
  // q, o, k, v; two norms of H and, as MiniMind-3, q/k norms of head_dim
  const double attention = 2 * H * H + 2 * H * kv + 2 * H + 2 * static_cast<double>(m.head_dim());
  const double experts = m.use_moe ? static_cast<double>(m.num_experts) : 1.0;
  const double shared = m.use_moe ? static_cast<double>(m.n_shared_experts) : 0.0;
  const double ffn =
      experts * 3 * H * static_cast<double>(m.expert_ffn_size()) +
      shared * 3 * H * static_cast<double>(m.shared_ffn_size()) +
      (m.use_moe && m.learned_router() ? static_cast<double>(m.num_experts) * H : 0.0);
  const double dense_ffn = 3 * H * static_cast<double>(m.ffn_size());
  const double embeddings = static_cast<double>(m.vocab_size) * H * (m.tie_word_embeddings ? 1 : 2);
  const double params =
      static_cast<double>(m.num_hidden_layers) * (attention + (m.use_moe ? ffn : dense_ffn)) +
      embeddings + H;
  const double rope =
      2.0 * static_cast<double>(m.max_position_embeddings) * static_cast<double>(m.head_dim());
  return 4.0 * (params * (training ? 4 : 1) + rope);
}

MemoryEstimate memory_estimate(const ModelConfig& m, bool training, int64_t rows, int64_t seq_len) {
  auto d = [](int64_t v) { return static_cast<double>(v); };
  MemoryEstimate e;
  e.weights = model_memory_bytes(m, training);
  const double L = d(m.num_hidden_layers), H = d(m.hidden_size), E = d(m.num_experts);
  if (m.use_moe) {
    // tid2eid [V, k] int64 per hash layer.
    e.routing += d(m.hash_layers) * d(m.vocab_size) * d(m.num_experts_per_tok) * 8;
    // Quantile balancing: an [E, bins] int64 histogram per layer kept over the step, and
    // about six more of one layer's while it is made and solved (bincount, cumsum, masks).
    if (training && m.router_bias_rule == BiasRule::quantile &&
        m.qb_estimator == QbEstimator::histogram)
      e.routing += (L + 6) * E * d(m.qb_num_bins) * 8;
  }
  // Floats kept per token and layer: the residual, norms, q/k/v/o and attention output
  // (~8 H), the attention weights over the row (heads x seq_len, twice), and the
  // feed-forward's gate, up, activation and product for each chosen expert and shared one;
  // the router's scores (E, three times). Then the logits with their softmax and gradient.
  const double k = m.use_moe ? d(m.num_experts_per_tok) : 1;
  const double ffn = m.use_moe ? k * d(m.expert_ffn_size()) +
                                     d(m.n_shared_experts) * d(m.shared_ffn_size()) + 3 * E
                               : d(m.ffn_size());
  const double per_layer = 8 * H + 2 * d(m.num_attention_heads) * d(seq_len) + 4 * ffn;
  const double tokens = d(rows) * d(seq_len);
  // Training keeps every layer's activations for the backward; evaluation one layer's.
  e.activations = 4 * tokens * ((training ? L : 1) * per_layer + 3 * d(m.vocab_size));
  return e;
}

void check_model_fits_memory(const ModelConfig& m, bool training, int64_t rows, int64_t seq_len) {
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                      static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  const MemoryEstimate e = memory_estimate(m, training, rows, seq_len);
  const double need = e.total();
  if (have <= 0 || need <= have) return;
  std::ostringstream msg;
  msg << std::setprecision(3) << "config error: this config needs " << need / 1e9 << " GB "
      << (training ? "to train" : "to load") << ", more than this machine's " << have / 1e9
      << " GB; most of it is ";
  if (e.routing >= e.weights && e.routing >= e.activations)
    msg << "the routing tables (" << e.routing / 1e9
        << " GB: model.qb_num_bins, model.num_experts, model.hash_layers, model.vocab_size)";
  else if (e.activations >= e.weights)
    msg << "the activations of a micro-batch of train.batch_size (" << rows
        << ") x data.max_seq_len (" << seq_len << ") tokens (" << e.activations / 1e9 << " GB)";
  else
    msg << "the model (" << e.weights / 1e9 << " GB: model.hidden_size (" << m.hidden_size
        << "), model.num_hidden_layers (" << m.num_hidden_layers << "), model.vocab_size ("
        << m.vocab_size << "), model.max_position_embeddings (" << m.max_position_embeddings << ")"
        << (m.use_moe ? " and the expert keys" : "") << ")";
  throw ConfigError(msg.str(), "check these keys for a typo");
}

#define MM_FIELD(sec, name)                                         \
  Field {                                                           \
#sec, #name, [](Config & c) -> FieldRef { return &c.sec.name; } \
  }

const std::vector<Field>& config_fields() {
  static const std::vector<Field> fields = {
      MM_FIELD(run, name),
      MM_FIELD(run, seed),
      MM_FIELD(run, threads),
      MM_FIELD(run, dist_timeout),
      MM_FIELD(run, precision),
      MM_FIELD(run, bf16_emulation),
      MM_FIELD(run, matmul),
      MM_FIELD(run, expert_parallel),
      MM_FIELD(model, hidden_size),
      MM_FIELD(model, num_hidden_layers),
      MM_FIELD(model, num_attention_heads),
      MM_FIELD(model, num_key_value_heads),
      MM_FIELD(model, vocab_size),
      MM_FIELD(model, max_position_embeddings),
      MM_FIELD(model, rope_theta),
      MM_FIELD(model, rms_norm_eps),
      MM_FIELD(model, hidden_act),
      MM_FIELD(model, intermediate_size),
      MM_FIELD(model, dropout),
      MM_FIELD(model, tie_word_embeddings),
      MM_FIELD(model, use_moe),
      MM_FIELD(model, num_experts),
      MM_FIELD(model, num_experts_per_tok),
      MM_FIELD(model, moe_intermediate_size),
      MM_FIELD(model, norm_topk_prob),
      MM_FIELD(model, router_aux_loss_coef),
      MM_FIELD(model, aux_loss_scope),
      MM_FIELD(model, router_z_loss_coef),
      MM_FIELD(model, router_importance_loss_coef),
      MM_FIELD(model, scoring_func),
      MM_FIELD(model, routed_scaling_factor),
      MM_FIELD(model, router_bias_update_rate),
      MM_FIELD(model, router_bias_rule),
      MM_FIELD(model, qb_estimator),
      MM_FIELD(model, qb_num_bins),
      MM_FIELD(model, qb_ema),
      MM_FIELD(model, hash_layers),
      MM_FIELD(model, hash_table),
      MM_FIELD(model, capacity_factor),
      MM_FIELD(model, capacity_drop_policy),
      MM_FIELD(model, n_shared_experts),
      MM_FIELD(model, shared_expert_intermediate_size),
      MM_FIELD(model, router),
      MM_FIELD(data, train),
      MM_FIELD(data, val),
      MM_FIELD(data, val_fraction),
      MM_FIELD(data, tokenizer),
      MM_FIELD(data, max_seq_len),
      MM_FIELD(data, mode),
      MM_FIELD(data, add_system_ratio),
      MM_FIELD(data, empty_think_ratio),
      MM_FIELD(data, sft_packing),
      MM_FIELD(data, cache_dir),
      MM_FIELD(data, strict),
      MM_FIELD(train, batch_size),
      MM_FIELD(train, accumulation_steps),
      MM_FIELD(train, max_steps),
      MM_FIELD(train, learning_rate),
      MM_FIELD(train, warmup_steps),
      MM_FIELD(train, weight_decay),
      MM_FIELD(train, beta1),
      MM_FIELD(train, beta2),
      MM_FIELD(train, eps),
      MM_FIELD(train, grad_clip),
      MM_FIELD(train, eval_interval),
      MM_FIELD(train, checkpoint_interval),
      MM_FIELD(train, keep_checkpoints),
      MM_FIELD(train, init_from),
      MM_FIELD(train, init_mode),
      MM_FIELD(train, upcycle_drop),
      MM_FIELD(train, upcycle_scaling),
      MM_FIELD(train, init_other_tokenizer),
      MM_FIELD(train, freeze),
      MM_FIELD(log, interval),
      MM_FIELD(log, collapse_max_share),
      MM_FIELD(log, collapse_dead_experts),
      MM_FIELD(log, collapse_patience),
      MM_FIELD(log, uninformative_mi),
      MM_FIELD(log, console),
      MM_FIELD(log, report_interval),
      MM_FIELD(log, tensorboard),
  };
  return fields;
}
#undef MM_FIELD

namespace {

// Validation helper: every message names the key, its value's origin, and the rule.
class Checker {
 public:
  explicit Checker(const Config& cfg) : cfg_(cfg) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::ostringstream msg;
    msg << "config error: " << key;
    auto it = cfg_.origin.find(key);
    msg << " (" << (it != cfg_.origin.end() ? it->second : "default") << "): " << what;
    throw ConfigError(msg.str());
  }
  // A combination of two keys that cannot work together: names both, with their origins.
  [[noreturn]] void conflict(const std::string& key, const std::string& other,
                             const std::string& what) const {
    fail(key, "cannot be combined with " + other + " (" + origin(other) + "): " + what);
  }
  std::string origin(const std::string& key) const {
    auto it = cfg_.origin.find(key);
    return it != cfg_.origin.end() ? it->second : "default";
  }
  bool set(const std::string& key) const { return cfg_.origin.count(key) > 0; }
  void one_of(const std::string& key, const std::string& v,
              std::initializer_list<const char*> allowed) const {
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return;
      list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
    }
    fail(key, "must be one of " + list + ", got \"" + v + "\"");
  }
  void non_negative_real(const std::string& key, double v) const {
    if (!(std::isfinite(v) && v >= 0)) {
      std::ostringstream s;
      s << "must be a finite number >= 0, got " << v;
      fail(key, s.str());
    }
  }
  void positive(const std::string& key, int64_t v) const {
    if (v <= 0) fail(key, "must be > 0, got " + std::to_string(v));
  }
  // A size: an integer from 1 to `max` (bounds that keep every product of sizes far from
  // int64's range; the memory estimate judges what lies within them).
  void size(const std::string& key, int64_t v, int64_t max) const {
    if (v <= 0 || v > max)
      fail(key, "must be from 1 to " + std::to_string(max) + ", got " + std::to_string(v));
  }
  void non_negative(const std::string& key, int64_t v) const {
    if (v < 0) fail(key, "must be >= 0, got " + std::to_string(v));
  }
  void in_range(const std::string& key, double v, double lo, double hi, bool hi_open) const {
    bool ok = std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
    if (!ok) {
      std::ostringstream s;
      s << "must be in [" << lo << ", " << hi << (hi_open ? ")" : "]") << ", got " << v;
      fail(key, s.str());
    }
  }
  void positive_real(const std::string& key, double v) const {
    if (!(std::isfinite(v) && v > 0)) {
      std::ostringstream s;
      s << "must be a finite number > 0, got " << v;
      fail(key, s.str());
    }
  }

 private:
  const Config& cfg_;
};

// Quantile balancing's keys, and what it cannot be combined with (the constraints Megatron-LM
// states for it, and the histogram's range).
void validate_quantile_balancing(const Checker& c, const ModelConfig& m) {
  if (m.qb_num_bins < 2 || m.qb_num_bins > kMaxSize.qb_bins)
    c.fail("model.qb_num_bins", "must be from 2 to " + std::to_string(kMaxSize.qb_bins) + ", got " +
                                    std::to_string(m.qb_num_bins));
  c.in_range("model.qb_ema", m.qb_ema, 0.0, 1.0, true);
  const ModelConfig defaults;
  if (m.router_bias_rule != BiasRule::quantile) {
    const std::vector<std::pair<const char*, bool>> qb_only = {
        {"model.qb_estimator", m.qb_estimator != defaults.qb_estimator},
        {"model.qb_num_bins", m.qb_num_bins != defaults.qb_num_bins},
        {"model.qb_ema", m.qb_ema != defaults.qb_ema}};
    for (const auto& [key, on] : qb_only)
      if (on)
        c.conflict(key, "model.router_bias_rule",
                   "it tunes quantile balancing; set router_bias_rule: quantile");
    return;
  }
  if (m.router_bias_update_rate != 0)
    c.conflict("model.router_bias_update_rate", "model.router_bias_rule",
               "the rate is the sign rule's step; quantile balancing replaces the bias with "
               "the solved quantile each step (set router_bias_update_rate: 0)");
  if (m.router_aux_loss_coef != 0)
    c.conflict("model.router_aux_loss_coef", "model.router_bias_rule",
               "Megatron-LM's quantile balancing asserts an aux-loss coefficient of 0 (PR "
               "#5349), and torchtitan's trains without one: the solved bias alone balances "
               "the load (set router_aux_loss_coef: 0)");
  if (m.num_experts_per_tok >= m.num_experts)
    c.conflict("model.num_experts_per_tok", "model.router_bias_rule",
               "quantile balancing reads each token's (k+1)-th best expert as its cutoff, so "
               "it needs num_experts_per_tok < num_experts");
  if (m.capacity_factor != 0)
    c.conflict("model.capacity_factor", "model.router_bias_rule",
               "Megatron-LM forbids quantile balancing with capacity dropping: the quantile "
               "assumes every chosen assignment is computed (set capacity_factor: 0)");
  if (m.scoring_func == ScoringFunc::sqrtsoftplus && m.qb_estimator == QbEstimator::histogram)
    c.conflict("model.qb_estimator", "model.scoring_func",
               "the histogram spans [min bias - 1, max bias + 1], which holds every needed "
               "bias only for scores in [0, 1]; sqrtsoftplus scores are unbounded (set "
               "qb_estimator: exact)");
}

// The balancing lab's keys: each value alone, then the combinations that cannot work.
void validate_balancing(const Checker& c, ModelConfig& m) {
  c.non_negative_real("model.router_z_loss_coef", m.router_z_loss_coef);
  c.non_negative_real("model.router_importance_loss_coef", m.router_importance_loss_coef);
  c.non_negative_real("model.router_bias_update_rate", m.router_bias_update_rate);
  c.non_negative_real("model.capacity_factor", m.capacity_factor);
  c.non_negative("model.n_shared_experts", m.n_shared_experts);
  if (m.n_shared_experts > kMaxSize.experts)
    c.fail("model.n_shared_experts", "must be at most " + std::to_string(kMaxSize.experts) +
                                         ", got " + std::to_string(m.n_shared_experts));
  // The routed experts' weights times this: beyond 1e3 (V4 uses 1.5) the feed-forward's
  // output overflows what training can recover from, or float32 itself.
  c.in_range("model.routed_scaling_factor", m.routed_scaling_factor, 1e-3, 1e3, false);
  if (m.shared_expert_intermediate_size)
    c.size("model.shared_expert_intermediate_size", *m.shared_expert_intermediate_size,
           kMaxSize.ffn);

  // Keys that change a MoE layer mean nothing in a dense model.
  const std::vector<std::pair<const char*, bool>> moe_only = {
      {"model.aux_loss_scope", m.aux_loss_scope != AuxScope::batch},
      {"model.router_z_loss_coef", m.router_z_loss_coef != 0},
      {"model.router_importance_loss_coef", m.router_importance_loss_coef != 0},
      {"model.scoring_func", m.scoring_func != ScoringFunc::softmax},
      {"model.routed_scaling_factor", m.routed_scaling_factor != 1.0},
      {"model.router_bias_update_rate", m.router_bias_update_rate != 0},
      {"model.router_bias_rule", m.router_bias_rule != BiasRule::sign},
      {"model.hash_layers", m.hash_layers != 0},
      {"model.capacity_factor", m.capacity_factor != 0},
      {"model.n_shared_experts", m.n_shared_experts != 0},
      {"model.router", m.router != RouterKind::learned},
  };
  if (!m.use_moe)
    for (const auto& [key, on] : moe_only)
      if (on)
        c.conflict(key, "model.use_moe",
                   "it changes MoE layers, and with use_moe: false there are none");

  // The control routers have no scores: nothing for a loss, a bias or a capacity ranking.
  if (!m.learned_router()) {
    const std::string why = "router \"" + std::string(name_of(m.router)) +
                            "\" routes without a learned score; this key applies to the "
                            "learned router only";
    if (m.router_aux_loss_coef != 0)
      c.conflict("model.router_aux_loss_coef", "model.router", why + " (set it to 0)");
    for (const auto& [key, on] : moe_only)
      if (on && std::string(key) != "model.router" && std::string(key) != "model.n_shared_experts")
        c.conflict(key, "model.router", why);
  }
  if (m.router == RouterKind::hash && m.num_experts_per_tok != 1)
    c.conflict("model.num_experts_per_tok", "model.router",
               "the hash router sends each token to exactly one expert (token id mod "
               "num_experts); set num_experts_per_tok: 1");
  validate_quantile_balancing(c, m);
  c.non_negative("model.hash_layers", m.hash_layers);
  if (m.hash_layers == 0 && m.hash_table != HashTable::round_robin)
    c.conflict("model.hash_table", "model.hash_layers",
               "a table for hash-routed layers, but there are none (set hash_layers >= 1)");
  if (m.use_moe && m.hash_layers >= m.num_hidden_layers)
    c.conflict("model.hash_layers", "model.num_hidden_layers",
               std::to_string(m.hash_layers) + " hash-routed layers of " +
                   std::to_string(m.num_hidden_layers) +
                   " MoE layers leave none that learns its routing; it must be less");
  if (m.n_shared_experts == 0 && m.shared_expert_intermediate_size &&
      c.set("model.shared_expert_intermediate_size"))
    c.conflict("model.shared_expert_intermediate_size", "model.n_shared_experts",
               "a width for shared experts, but there are none (set n_shared_experts >= 1)");
  if (m.n_shared_experts > 0) m.shared_expert_intermediate_size = m.shared_ffn_size();
}

void validate_model(const Checker& c, ModelConfig& m) {
  c.size("model.hidden_size", m.hidden_size, kMaxSize.hidden);
  c.size("model.num_hidden_layers", m.num_hidden_layers, kMaxSize.layers);
  c.size("model.num_attention_heads", m.num_attention_heads, kMaxSize.heads);
  c.size("model.num_key_value_heads", m.num_key_value_heads, kMaxSize.heads);
  c.size("model.max_position_embeddings", m.max_position_embeddings, kMaxSize.positions);
  if (m.vocab_size < 3)
    c.fail("model.vocab_size",
           "must be >= 3 (ids 0/1/2 are pad/bos/eos), got " + std::to_string(m.vocab_size));
  c.size("model.vocab_size", m.vocab_size, kMaxSize.vocab);
  if (m.hidden_size % m.num_attention_heads != 0)
    c.fail("model.hidden_size", std::to_string(m.hidden_size) +
                                    " is not divisible by model.num_attention_heads (" +
                                    std::to_string(m.num_attention_heads) + ")");
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    c.fail("model.num_attention_heads", std::to_string(m.num_attention_heads) +
                                            " is not divisible by model.num_key_value_heads (" +
                                            std::to_string(m.num_key_value_heads) + ")");
  if (m.head_dim() % 2 != 0)
    c.fail("model.hidden_size",
           "head_dim = hidden_size / num_attention_heads = " + std::to_string(m.head_dim()) +
               " must be even for rotary embeddings");
  c.positive_real("model.rope_theta", m.rope_theta);
  c.positive_real("model.rms_norm_eps", m.rms_norm_eps);
  if (m.hidden_act != "silu")
    c.fail("model.hidden_act",
           "only \"silu\" is supported (MiniMind's), got \"" + m.hidden_act + "\"");
  c.in_range("model.dropout", m.dropout, 0.0, 1.0, true);
  if (m.intermediate_size) c.size("model.intermediate_size", *m.intermediate_size, kMaxSize.ffn);
  if (m.moe_intermediate_size)
    c.size("model.moe_intermediate_size", *m.moe_intermediate_size, kMaxSize.ffn);
  c.size("model.num_experts", m.num_experts, kMaxSize.experts);
  c.positive("model.num_experts_per_tok", m.num_experts_per_tok);
  if (m.num_experts_per_tok > m.num_experts)
    c.fail("model.num_experts_per_tok", std::to_string(m.num_experts_per_tok) +
                                            " is more than model.num_experts (" +
                                            std::to_string(m.num_experts) + ")");
  if (!(std::isfinite(m.router_aux_loss_coef) && m.router_aux_loss_coef >= 0))
    c.fail("model.router_aux_loss_coef", "must be a finite number >= 0");
  validate_balancing(c, m);

  // Resolve the derived widths so the saved config states them.
  m.intermediate_size = m.ffn_size();
  m.moe_intermediate_size = m.expert_ffn_size();
}

void validate_data(const Checker& c, const Config& cfg) {
  const DataConfig& d = cfg.data;
  if (d.train.empty()) c.fail("data.train", "must name a JSONL corpus");
  c.in_range("data.val_fraction", d.val_fraction, 0.0, 1.0, true);
  // pad mode needs room for bos + eos + one token.
  if (d.max_seq_len < 3 || d.max_seq_len > kMaxSize.positions)
    c.fail("data.max_seq_len", "must be from 3 to " + std::to_string(kMaxSize.positions) +
                                   ", got " + std::to_string(d.max_seq_len));
  if (d.max_seq_len > cfg.model.max_position_embeddings)
    c.fail("data.max_seq_len", std::to_string(d.max_seq_len) +
                                   " exceeds model.max_position_embeddings (" +
                                   std::to_string(cfg.model.max_position_embeddings) + ")");
  if (d.mode != "pack" && d.mode != "pad" && d.mode != "sft")
    c.fail("data.mode", "must be \"pack\", \"pad\" or \"sft\", got \"" + d.mode + "\"");
  c.in_range("data.add_system_ratio", d.add_system_ratio, 0.0, 1.0, false);
  c.in_range("data.empty_think_ratio", d.empty_think_ratio, 0.0, 1.0, false);
  if (d.sft_packing && d.mode != "sft")
    c.fail("data.sft_packing",
           "packs chat conversations: it needs data.mode sft, got \"" + d.mode + "\"");
  // pack rows hold max_seq_len + 1 tokens (max_seq_len predictions).
  if (d.mode == "pack" && d.max_seq_len + 1 > cfg.model.max_position_embeddings)
    c.fail("data.max_seq_len",
           "pack mode needs max_seq_len + 1 <= model.max_position_embeddings (" +
               std::to_string(cfg.model.max_position_embeddings) + ")");
  if (d.cache_dir.empty()) c.fail("data.cache_dir", "must name a directory");
}

void validate_train(const Checker& c, const TrainConfig& t) {
  c.size("train.batch_size", t.batch_size, kMaxSize.batch);
  c.positive("train.accumulation_steps", t.accumulation_steps);
  c.positive("train.max_steps", t.max_steps);
  c.positive_real("train.learning_rate", t.learning_rate);
  c.non_negative("train.warmup_steps", t.warmup_steps);
  if (t.warmup_steps >= t.max_steps)
    c.fail("train.warmup_steps", std::to_string(t.warmup_steps) +
                                     " must be less than train.max_steps (" +
                                     std::to_string(t.max_steps) + ")");
  c.in_range("train.weight_decay", t.weight_decay, 0.0, 1.0, false);
  c.in_range("train.beta1", t.beta1, 0.0, 1.0, true);
  c.in_range("train.beta2", t.beta2, 0.0, 1.0, true);
  c.positive_real("train.eps", t.eps);
  if (!(std::isfinite(t.grad_clip) && t.grad_clip >= 0))
    c.fail("train.grad_clip", "must be a finite number >= 0 (0 disables clipping)");
  c.positive("train.eval_interval", t.eval_interval);
  c.positive("train.checkpoint_interval", t.checkpoint_interval);
  c.positive("train.keep_checkpoints", t.keep_checkpoints);
  if (t.init_mode != "copy" && t.init_mode != "upcycle")
    c.fail("train.init_mode", "must be \"copy\" or \"upcycle\", got \"" + t.init_mode + "\"");
  if (t.init_mode == "upcycle" && t.init_from.empty())
    c.fail("train.init_mode", "upcycle needs train.init_from (the dense model's weights)");
  c.in_range("train.upcycle_drop", t.upcycle_drop, 0.0, 1.0, false);
  if (t.upcycle_drop > 0 && t.init_mode != "upcycle")
    c.fail("train.upcycle_drop",
           "re-initialises upcycled experts: it needs train.init_mode: "
           "upcycle");
  if (t.init_other_tokenizer && t.init_from.empty())
    c.fail("train.init_other_tokenizer",
           "says data.tokenizer replaces train.init_from's "
           "tokenizer, but train.init_from is empty");
  if (t.upcycle_scaling && t.init_mode != "upcycle")
    c.fail("train.upcycle_scaling", "scales upcycled experts: it needs train.init_mode: upcycle");
}

const std::vector<std::string>& freeze_groups() {
  static const std::vector<std::string> groups = {"router",    "experts",    "shared_experts",
                                                  "attention", "embeddings", "norms"};
  return groups;
}

// train.freeze: known groups, each once, the model's, and not every one of them.
void validate_freeze(const Checker& c, const Config& cfg) {
  const std::vector<std::string>& groups = cfg.train.freeze;
  if (groups.empty()) return;
  const ModelConfig& m = cfg.model;
  // The model's groups: a dense model's feed-forward is its "experts".
  std::vector<std::string> present = {"attention", "embeddings", "norms", "experts"};
  if (m.use_moe) {
    present.push_back("router");  // hash layers too: their gate gives the mixing weights
    if (m.n_shared_experts > 0) present.push_back("shared_experts");
  }
  std::vector<std::string> seen;
  for (const std::string& g : groups) {
    if (std::find(freeze_groups().begin(), freeze_groups().end(), g) == freeze_groups().end())
      c.fail("train.freeze", "unknown group \"" + g + "\"; groups are " +
                                 fmt::format("{}", fmt::join(freeze_groups(), ", ")));
    else if (std::find(present.begin(), present.end(), g) == present.end())
      c.fail("train.freeze", "this model has no " + g +
                                 (g == "shared_experts" ? " (model.n_shared_experts is 0)"
                                                        : " (model.use_moe is false)"));
    else if (std::find(seen.begin(), seen.end(), g) != seen.end())
      c.fail("train.freeze", "\"" + g + "\" is named twice");
    seen.push_back(g);
  }
  if (cfg.run.expert_parallel > 1)
    c.fail("train.freeze", "is not yet supported with run.expert_parallel > 1");
  if (std::all_of(present.begin(), present.end(), [&](const std::string& g) {
        return std::find(groups.begin(), groups.end(), g) != groups.end();
      }))
    c.fail("train.freeze", "freezes every parameter of the model: nothing would train");
}

void validate_run(const Checker& c, const RunConfig& r) {
  // A name, never a path: runs/<name> must be a directory of its own under runs/ ("." or
  // ".." would make it runs/ itself or the working directory).
  if (r.name.empty() || r.name.find_first_of(std::string("/\\ \t\n\0", 6)) != std::string::npos ||
      r.name == "." || r.name == "..")
    c.fail("run.name",
           "must be a name without slashes or spaces, other than . and .. (it names "
           "the run directory runs/<name>; --out DIR gives a path), got \"" +
               r.name + "\"");
  c.non_negative("run.seed", r.seed);
  c.non_negative("run.threads", r.threads);
  if (r.threads > kMaxThreads)
    c.fail("run.threads",
           "must be at most " + std::to_string(kMaxThreads) + ", got " + std::to_string(r.threads));
  c.positive("run.dist_timeout", r.dist_timeout);
  c.positive("run.expert_parallel", r.expert_parallel);
}

}  // namespace

std::vector<std::string> validate_and_resolve(Config& cfg) {
  Checker c(cfg);
  validate_run(c, cfg.run);
  if (cfg.run.expert_parallel > 1) {
    if (!cfg.model.use_moe)
      c.fail("run.expert_parallel",
             "spreads routed experts over ranks: it needs model.use_moe "
             "true (got " +
                 std::to_string(cfg.run.expert_parallel) + ")");
    else if (cfg.model.num_experts % cfg.run.expert_parallel != 0)
      c.fail("run.expert_parallel",
             "must divide model.num_experts = " + std::to_string(cfg.model.num_experts) +
                 " (each rank of an expert group holds as many), got " +
                 std::to_string(cfg.run.expert_parallel));
  }
  validate_model(c, cfg.model);
  validate_data(c, cfg);
  validate_train(c, cfg.train);
  validate_freeze(c, cfg);
  c.positive("log.interval", cfg.log.interval);
  c.in_range("log.collapse_max_share", cfg.log.collapse_max_share, 0.0, 1.0, false);
  c.positive("log.collapse_dead_experts", cfg.log.collapse_dead_experts);
  c.positive("log.collapse_patience", cfg.log.collapse_patience);
  c.in_range("log.uninformative_mi", cfg.log.uninformative_mi, 0.0, 1.0, true);
  c.one_of("log.console", cfg.log.console, {"compact", "full"});
  c.non_negative("log.report_interval", cfg.log.report_interval);

  std::vector<std::string> warnings;
  const ModelConfig& m = cfg.model;
  if (m.use_moe && m.learned_router() && m.num_experts_per_tok == 1 && m.norm_topk_prob) {
    warnings.push_back(
        "model.num_experts_per_tok = 1 with model.norm_topk_prob = true: the single "
        "routing weight is renormalised to exactly 1.0, so the language-model loss sends "
        "no gradient to the router (MiniMind issue #858); only the aux loss trains it, "
        "which only pushes routing towards uniform. Set norm_topk_prob: false (the weight "
        "is then the router's softmax probability, as in Switch Transformer) or use "
        "num_experts_per_tok >= 2.");
  }
  if (m.use_moe && m.learned_router() && m.num_experts_per_tok == 1 && m.norm_topk_prob &&
      m.router_aux_loss_coef == 0 && m.router_importance_loss_coef == 0 &&
      m.router_z_loss_coef == 0)
    warnings.push_back(
        "model.num_experts_per_tok = 1 with model.norm_topk_prob = true and no router loss "
        "(aux, importance or z): the router's weights get no gradient at all and stay at "
        "their initial values; only the selection bias (if any) moves the routing.");
  if (m.use_moe && m.router_bias_rule == BiasRule::quantile &&
      m.scoring_func == ScoringFunc::softmax)
    warnings.push_back(
        "model.router_bias_rule = quantile with model.scoring_func = softmax: torchtitan and "
        "Megatron-LM's global-batch quantile balancing take sigmoid scores only; over softmax "
        "scores it is this lab's extension (the histogram's range still holds).");
  if (m.use_moe && m.learned_router() && m.router_aux_loss_coef == 0 && !m.selection_bias() &&
      m.capacity_factor == 0 && m.router_importance_loss_coef == 0) {
    warnings.push_back(
        "model.router_aux_loss_coef = 0: nothing balances the experts; watch the "
        "expert-load logs for collapse.");
  }
  if (m.use_moe && m.router_aux_loss_coef == 0 && m.aux_loss_scope != AuxScope::batch)
    warnings.push_back("model.aux_loss_scope = " + std::string(name_of(m.aux_loss_scope)) +
                       " with model.router_aux_loss_coef = 0: there is no aux loss to scope.");
  if (m.use_moe && m.router_bias_update_rate > 0 && m.scoring_func == ScoringFunc::softmax)
    warnings.push_back(
        "model.router_bias_update_rate > 0 with model.scoring_func = softmax: the bias was "
        "designed for DeepSeek-V3's independent sigmoid affinities (Megatron refuses this "
        "pair). Softmax scores of one token compete, so a bias step of fixed size moves "
        "selection by an amount that depends on how peaked the softmax is; consider "
        "scoring_func: sigmoid (or sqrtsoftplus).");
  // Only a policy other than the default is worth a word: a config written by
  // --print-config names every key.
  if (m.use_moe && m.capacity_factor == 0 && cfg.origin.count("model.capacity_drop_policy") &&
      m.capacity_drop_policy != ModelConfig{}.capacity_drop_policy)
    warnings.push_back(
        "model.capacity_drop_policy is set but model.capacity_factor = 0 (dropless): no "
        "token is dropped, so the policy has no effect.");
  return warnings;
}

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedConfig out{load_config_file(path), {}};
  const bool file_sets_nothing = out.config.origin.empty();
  for (const auto& o : overrides) apply_override(out.config, o);
  // An empty file would train MiniMind's full 768-wide defaults into runs/minimind: most
  // likely the wrong file. Training the defaults on purpose takes naming the run.
  if (file_sets_nothing && !out.config.origin.count("run.name"))
    throw ConfigError("config error: '" + path + "' sets no key",
                      "start from a preset (configs/moe.yaml), or set run.name (e.g. --set "
                      "run.name=defaults) to train MiniMind's full default model on purpose");
  out.warnings = validate_and_resolve(out.config);
  return out;
}

}  // namespace minimind
