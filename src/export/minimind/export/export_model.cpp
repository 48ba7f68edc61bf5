#include "minimind/export/export_model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "minimind/error.h"
#include "minimind/export/gguf.h"
#include "minimind/export/hf_tokenizer.h"
#include "minimind/export/safetensors.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/output_path.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void refuse(const std::string& key, const std::string& target,
                         const std::string& why) {
  throw ConfigError("cannot export to " + target + ": " + key + " " + why,
                    target == "GGUF" ? "train without it, or use --format hf where it applies"
                                     : "use --format gguf (llama.cpp computes it), or train "
                                       "without it");
}

// Every parameter and buffer of the model by MiniMind's name.
std::map<std::string, torch::Tensor> state_of(const EvalModel& m) {
  std::map<std::string, torch::Tensor> s;
  for (const auto& p : m.model->named_parameters()) s[p.key()] = p.value().detach();
  for (const auto& b : m.model->named_buffers()) s[b.key()] = b.value().detach();
  return s;
}

const torch::Tensor& at(const std::map<std::string, torch::Tensor>& s, const std::string& name) {
  const auto it = s.find(name);
  if (it == s.end()) throw WeightsError("the model has no tensor " + name);
  return it->second;
}

GgufType gguf_type(ExportDtype d) {
  return d == ExportDtype::f32   ? GgufType::f32
         : d == ExportDtype::f16 ? GgufType::f16
                                 : GgufType::bf16;
}

// pad, bos and eos (the tokenizer's), and how llama.cpp wraps a prompt: [bos] first, as
// the model was trained, no [eos].
void add_gguf_special_ids(GgufWriter& w, const SpecialIds& s) {
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(s.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(s.eos));
  w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(s.pad));
  // The end of a turn is eos (<|im_end|>): unpinned, llama.cpp takes the pad's
  // <|endoftext|> for it, and a chat through it would not stop where the model ends a turn.
  w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(s.eos));
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

// A tokenizer.json (byte-level BPE) as llama.cpp's "gpt2" vocabulary: the tokens as the
// file spells them, the merges as "a b" strings, and the pre-tokenizer "gpt-2", whose
// splitter is GPT-2's regex (llama.cpp's default for an unknown BPE would split otherwise).
// Token types as llama.cpp's converter gives them: special added tokens and those that look
// special (<|...|>) control, the other added ones user-defined.
void add_gguf_byte_level_tokenizer(GgufWriter& w, const ByteLevelBpe& bpe,
                                   const SpecialIds& specials) {
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
  for (int32_t id = 0; id < bpe.vocab_size(); ++id) {
    const std::string& t = bpe.token(id);
    tokens.push_back(t);
    const bool looks_special =
        t.size() > 4 && t.rfind("<|", 0) == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
    types.push_back(!bpe.is_added(id) ? 1 : bpe.is_special(id) || looks_special ? 3 : 4);
  }
  for (const auto& [a, b] : bpe.merges()) merges.push_back(a + " " + b);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "gpt-2");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_strings("tokenizer.ggml.merges", merges);
  add_gguf_special_ids(w, specials);
}

// Our sentencepiece model as llama.cpp's "llama" vocabulary.
void add_gguf_sentencepiece_tokenizer(GgufWriter& w, const Tokenizer& tok) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    tokens.push_back(tok.piece(id));
    scores.push_back(tok.score(id));
    types.push_back(static_cast<int32_t>(tok.piece_type(id)));
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  add_gguf_special_ids(w, tok.specials());
  if (const int32_t unk = tok.unknown_id(); unk >= 0)
    w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(unk));
  // Our sentencepiece model adds no dummy prefix; llama.cpp's default would add one and
  // change the first token of every text.
  w.add_bool("tokenizer.ggml.add_space_prefix", false);
}

// The tokenizer as llama.cpp reads one, and its chat template under llama.cpp's key, for its
// chat: the one a tokenizer.json came with, or MiniMind-3's in our words for ours.
void add_gguf_tokenizer(GgufWriter& w, const Tokenizer& tok) {
  if (tok.byte_level_bpe())
    add_gguf_byte_level_tokenizer(w, *tok.byte_level_bpe(), tok.specials());
  else
    add_gguf_sentencepiece_tokenizer(w, tok);
  if (const std::string chat = tok.chat_template_for_files(); !chat.empty())
    w.add_string("tokenizer.chat_template", chat);
}

std::string gguf_bytes(const EvalModel& em, ExportDtype dtype) {
  const ModelConfig& m = em.config.model;
  const std::string arch = gguf_architecture(m);
  const auto s = state_of(em);
  const GgufType wt = gguf_type(dtype);
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.name", em.config.run.name);
  w.add_u32(arch + ".context_length", static_cast<uint32_t>(m.max_position_embeddings));
  w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(m.hidden_size));
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(m.num_hidden_layers));
  w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(m.ffn_size()));
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(m.num_attention_heads));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(m.num_key_value_heads));
  w.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(m.head_dim()));
  w.add_u32(arch + ".attention.value_length", static_cast<uint32_t>(m.head_dim()));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(m.rms_norm_eps));
  w.add_f32(arch + ".rope.freq_base", static_cast<float>(m.rope_theta));  // llama.cpp: 1e4
  w.add_u32(arch + ".vocab_size", static_cast<uint32_t>(m.vocab_size));
  const bool shared = m.n_shared_experts > 0;
  if (m.use_moe) {
    w.add_u32(arch + ".expert_count", static_cast<uint32_t>(m.num_experts));
    w.add_u32(arch + ".expert_used_count", static_cast<uint32_t>(m.num_experts_per_tok));
    w.add_u32(arch + ".expert_feed_forward_length", static_cast<uint32_t>(m.expert_ffn_size()));
  }
  if (arch == "hy_v3") {
    w.add_bool(arch + ".expert_weights_norm", m.norm_topk_prob);
    w.add_u32(arch + ".expert_gating_func", m.scoring_func == ScoringFunc::sigmoid ? 2 : 1);
    w.add_f32(arch + ".expert_weights_scale", 1.0f);
    // Its graph always adds a shared expert: without ours, a zero one of width 1.
    w.add_u32(arch + ".expert_shared_feed_forward_length",
              static_cast<uint32_t>(shared ? m.n_shared_experts * m.shared_ffn_size() : 1));
  }
  add_gguf_tokenizer(w, *em.tokenizer);

  // Vectors (norms, the selection bias) and the router stay float32, as llama.cpp's own
  // converter keeps them: a rounded router could choose other experts.
  w.add_tensor("token_embd.weight", at(s, "model.embed_tokens.weight"), wt);
  w.add_tensor("output_norm.weight", at(s, "model.norm.weight"), GgufType::f32);
  if (!m.tie_word_embeddings) w.add_tensor("output.weight", at(s, "lm_head.weight"), wt);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l), p = fmt::format("model.layers.{}.", l);
    w.add_tensor(b + "attn_norm.weight", at(s, p + "input_layernorm.weight"), GgufType::f32);
    w.add_tensor(b + "attn_q.weight", at(s, p + "self_attn.q_proj.weight"), wt);
    w.add_tensor(b + "attn_k.weight", at(s, p + "self_attn.k_proj.weight"), wt);
    w.add_tensor(b + "attn_v.weight", at(s, p + "self_attn.v_proj.weight"), wt);
    w.add_tensor(b + "attn_output.weight", at(s, p + "self_attn.o_proj.weight"), wt);
    w.add_tensor(b + "attn_q_norm.weight", at(s, p + "self_attn.q_norm.weight"), GgufType::f32);
    w.add_tensor(b + "attn_k_norm.weight", at(s, p + "self_attn.k_norm.weight"), GgufType::f32);
    w.add_tensor(b + "ffn_norm.weight", at(s, p + "post_attention_layernorm.weight"),
                 GgufType::f32);
    if (!m.use_moe) {
      for (const char* proj : {"gate", "up", "down"})
        w.add_tensor(b + "ffn_" + proj + ".weight", at(s, p + "mlp." + proj + "_proj.weight"), wt);
      continue;
    }
    w.add_tensor(b + "ffn_gate_inp.weight", at(s, p + "mlp.gate.weight"), GgufType::f32);
    for (const char* proj : {"gate", "up", "down"}) {
      std::vector<torch::Tensor> experts;  // each [F, H] (gate, up) or [H, F] (down)
      for (int64_t e = 0; e < m.num_experts; ++e)
        experts.push_back(at(s, p + fmt::format("mlp.experts.{}.{}_proj.weight", e, proj)));
      w.add_tensor(b + "ffn_" + proj + "_exps.weight", torch::stack(experts), wt);  // [E, ., .]
    }
    if (const auto bias = s.find(p + "mlp.gate.e_score_correction_bias");
        bias != s.end() && m.selection_bias())
      w.add_tensor(b + "exp_probs_b", bias->second, GgufType::f32);  // [E]
    if (arch != "hy_v3") continue;
    // Shared experts as one of their summed width: gate and up stacked along their
    // outputs, down along its inputs, which sums the experts' outputs.
    torch::Tensor gate, up, down;
    if (shared) {
      std::vector<torch::Tensor> g, u, d;
      for (int64_t i = 0; i < m.n_shared_experts; ++i) {
        const std::string e = p + fmt::format("mlp.shared_experts.{}.", i);
        g.push_back(at(s, e + "gate_proj.weight")), u.push_back(at(s, e + "up_proj.weight"));
        d.push_back(at(s, e + "down_proj.weight"));
      }
      gate = torch::cat(g, 0), up = torch::cat(u, 0), down = torch::cat(d, 1);  // [nF, H], [H, nF]
    } else {
      gate = torch::zeros({1, m.hidden_size}), up = torch::zeros({1, m.hidden_size});
      down = torch::zeros({m.hidden_size, 1});
    }
    w.add_tensor(b + "ffn_gate_shexp.weight", gate, wt);
    w.add_tensor(b + "ffn_up_shexp.weight", up, wt);
    w.add_tensor(b + "ffn_down_shexp.weight", down, wt);
  }
  return w.bytes();
}

Json hf_config(const Config& cfg, ExportDtype dtype, const SpecialIds& specials) {
  const ModelConfig& m = cfg.model;
  Json c;
  c["architectures"] = {hf_architecture(m)};
  c["model_type"] = m.use_moe ? "qwen3_moe" : "qwen3";
  c["vocab_size"] = m.vocab_size;
  c["hidden_size"] = m.hidden_size;
  c["intermediate_size"] = m.ffn_size();
  c["num_hidden_layers"] = m.num_hidden_layers;
  c["num_attention_heads"] = m.num_attention_heads;
  c["num_key_value_heads"] = m.num_key_value_heads;
  c["head_dim"] = m.head_dim();
  c["max_position_embeddings"] = m.max_position_embeddings;
  c["rms_norm_eps"] = m.rms_norm_eps;
  c["rope_theta"] = m.rope_theta;
  c["hidden_act"] = m.hidden_act;
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["tie_word_embeddings"] = m.tie_word_embeddings;
  c["bos_token_id"] = specials.bos, c["eos_token_id"] = specials.eos;
  c["pad_token_id"] = specials.pad;
  if (m.use_moe) {
    c["num_experts"] = m.num_experts;
    c["num_experts_per_tok"] = m.num_experts_per_tok;
    c["moe_intermediate_size"] = m.expert_ffn_size();
    c["norm_topk_prob"] = m.norm_topk_prob;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = Json::array();
    c["router_aux_loss_coef"] = m.router_aux_loss_coef;
    c["output_router_logits"] = false;
  }
  c["torch_dtype"] = dtype == ExportDtype::f32   ? "float32"
                     : dtype == ExportDtype::f16 ? "float16"
                                                 : "bfloat16";
  c["use_cache"] = true;
  return c;
}

// The Hugging Face directory's files, by name.
std::map<std::string, std::string> hf_files(const EvalModel& em, ExportDtype dtype) {
  const ModelConfig& m = em.config.model;
  hf_architecture(m);  // refuses what Qwen3 cannot compute
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, t] : state_of(em)) {
    if (name == "lm_head.weight" && m.tie_word_embeddings) continue;  // transformers ties it
    if (name.find("e_score_correction_bias") != std::string::npos) continue;  // all zero here
    tensors.emplace_back(name, t);
  }
  const std::string st = dtype == ExportDtype::f32   ? "F32"
                         : dtype == ExportDtype::f16 ? "F16"
                                                     : "BF16";
  std::map<std::string, std::string> files;
  files["model.safetensors"] = safetensors_bytes(tensors, st, {{"format", "pt"}});
  const SpecialIds& specials = em.tokenizer->specials();
  files["config.json"] = hf_config(em.config, dtype, specials).dump(2) + "\n";
  Json gen;
  gen["bos_token_id"] = specials.bos, gen["eos_token_id"] = specials.eos;
  gen["pad_token_id"] = specials.pad;
  gen["do_sample"] = true;  // MiniMind's sampling defaults
  gen["temperature"] = 0.85, gen["top_p"] = 0.85, gen["top_k"] = 50;
  gen["repetition_penalty"] = 1.0;
  files["generation_config.json"] = gen.dump(2) + "\n";
  // A tokenizer.json goes as it is; a sentencepiece model as both forms.
  files["tokenizer.json"] =
      em.tokenizer->is_hf_json() ? em.tokenizer->model_bytes() : hf_tokenizer_json(*em.tokenizer);
  files["tokenizer_config.json"] = hf_tokenizer_config(*em.tokenizer, m.max_position_embeddings);
  if (!em.tokenizer->is_hf_json()) files["tokenizer.model"] = em.tokenizer->model_bytes();
  return files;
}

// The files an HF export writes: a directory holding only these is one of ours.
bool written_by_hf_export(const std::string& name) {
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json",
                        "tokenizer.json", "tokenizer_config.json", "tokenizer.model"})
    if (name == f) return true;
  return false;
}

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

// Whether `out` may be written: a new path, or with --overwrite an output of the same
// format that this tool wrote; never the input or a path inside the checkpoint read.
void check_export_target(const EvalModel& m, ExportFormat format, const std::string& out,
                         bool overwrite) {
  const std::string checkpoint =
      m.run_dir.empty() ? std::string() : fs::path(m.weights).parent_path().string();
  if (format == ExportFormat::gguf) {
    check_output_file(out, "--out");
    if (is_same_or_inside(out, m.weights) ||
        (!checkpoint.empty() && is_same_or_inside(out, checkpoint)))
      throw Error("--out '" + out + "' lies in the checkpoint being read (" +
                      (checkpoint.empty() ? m.weights : checkpoint) + ")",
                  "write the export somewhere else");
  } else {
    if (const std::string kind = path_kind(out); !kind.empty() && kind != "a directory")
      throw Error("--out '" + out + "' is " + kind + "; --format hf writes a directory",
                  "give a new directory's name");
    check_replaceable_directory(out, "--out", {m.weights, checkpoint});
  }
  if (!fs::exists(fs::symlink_status(out))) return;
  if (!overwrite)
    throw Error("'" + out + "' exists", "pass --overwrite to replace it, or choose another --out");
  if (format == ExportFormat::gguf && fs::file_size(out) > 0 && !is_gguf_file(out))
    throw Error("'" + out + "' is not a GGUF file, so --overwrite leaves it as it is",
                "choose another --out");
  if (format == ExportFormat::hf) {
    std::vector<std::string> foreign;
    for (const auto& e : fs::directory_iterator(out))
      if (!written_by_hf_export(e.path().filename().string()))
        foreign.push_back(e.path().filename().string());
    std::sort(foreign.begin(), foreign.end());
    if (!foreign.empty())
      throw Error("'" + out + "' holds " + foreign.front() +
                      (foreign.size() > 1 ? fmt::format(" and {} more", foreign.size() - 1) : "") +
                      ", which minimind-export did not write, so --overwrite leaves it as it is",
                  "choose another --out, or move those files away first");
  }
}

// What neither target computes: a router that is not learned, and capacity dropping.
void refuse_unlearned_or_dropping(const ModelConfig& m, const std::string& target,
                                  const std::string& runtime) {
  if (!m.learned_router())
    refuse("model.router = " + std::string(name_of(m.router)), target,
           "has no counterpart in " + runtime + ", whose MoE layers route by a learned gate");
  if (m.hash_layers > 0)
    refuse("model.hash_layers", target,
           "(layers that choose experts by a token-id table) has no counterpart in " + runtime +
               ", whose MoE layers choose by the gate's scores");
  if (m.capacity_factor > 0)
    refuse("model.capacity_factor = " + fmt::format("{}", m.capacity_factor), target,
           "drops tokens that overflow an expert; " + runtime +
               " never drops one, so its outputs would differ");
}

}  // namespace

std::string gguf_architecture(const ModelConfig& m) {
  if (!m.use_moe) return "qwen3";
  refuse_unlearned_or_dropping(m, "GGUF", "llama.cpp");
  if (m.scoring_func == ScoringFunc::sqrtsoftplus)
    refuse("model.scoring_func = sqrtsoftplus", "GGUF",
           "has no counterpart in llama.cpp, whose gating functions are softmax and sigmoid");
  if (m.routed_scaling_factor != 1.0)
    refuse("model.routed_scaling_factor", "GGUF",
           "is not carried by this export (its scale on the routed weights is not checked "
           "against llama.cpp)");
  const bool plain =
      m.scoring_func == ScoringFunc::softmax && !m.selection_bias() && m.n_shared_experts == 0;
  // qwen3moe always renormalises the chosen weights; hy_v3 reads whether to.
  return plain && m.norm_topk_prob ? "qwen3moe" : "hy_v3";
}

std::string hf_architecture(const ModelConfig& m) {
  if (!m.use_moe) return "Qwen3ForCausalLM";
  refuse_unlearned_or_dropping(m, "a Hugging Face Qwen3-MoE", "Qwen3-MoE");
  if (m.scoring_func != ScoringFunc::softmax)
    refuse("model.scoring_func = " + std::string(name_of(m.scoring_func)),
           "a Hugging Face Qwen3-MoE",
           "has no counterpart: Qwen3-MoE scores experts with a softmax");
  if (m.routed_scaling_factor != 1.0)
    refuse("model.routed_scaling_factor", "a Hugging Face Qwen3-MoE",
           "has no counterpart: Qwen3-MoE does not scale the routed weights");
  if (m.selection_bias())
    refuse(m.router_bias_rule == BiasRule::quantile ? "model.router_bias_rule = quantile"
                                                    : "model.router_bias_update_rate",
           "a Hugging Face Qwen3-MoE", "(the selection bias) has no counterpart in Qwen3-MoE");
  if (m.n_shared_experts > 0)
    refuse("model.n_shared_experts", "a Hugging Face Qwen3-MoE",
           "has no counterpart: Qwen3-MoE has no shared experts");
  return "Qwen3MoeForCausalLM";
}

void export_model(const EvalModel& m, ExportFormat format, ExportDtype dtype,
                  const std::string& out, bool overwrite) {
  if (!m.tokenizer)
    throw TokenizerError(
        "exporting needs the tokenizer: pass --tokenizer FILE (a .model or tokenizer.json)");
  check_export_target(m, format, out, overwrite);
  // Written whole under a temporary name, then put in place of the old output in one step.
  OutputReplacement replacement(out);
  if (format == ExportFormat::gguf) {
    write_file_atomic(replacement.temp(), gguf_bytes(m, dtype));
  } else {
    const fs::path tmp = replacement.temp();
    fs::create_directories(tmp);
    for (const auto& [name, bytes] : hf_files(m, dtype))
      write_file_atomic((tmp / name).string(), bytes);
  }
  replacement.commit();
}

}  // namespace minimind
