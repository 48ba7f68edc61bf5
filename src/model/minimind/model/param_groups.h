// The groups train.freeze names, by parameter name (MiniMind's state-dict names).
#pragma once

#include <string>

namespace minimind {

// router: an MoE layer's gate (its selection bias is a buffer that follows the gate: frozen
// with it); experts: the routed experts, and a dense layer's feed-forward; shared_experts;
// attention: q, k, v and o projections; norms: every RMSNorm weight, q_norm and k_norm
// included; embeddings: the token embedding and an untied lm_head.
inline std::string param_group(const std::string& name) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("embed_tokens.") || name.rfind("lm_head.", 0) == 0) return "embeddings";
  if (has("norm.")) return "norms";  // input_layernorm, post_attention_layernorm, q/k_norm, norm
  if (has(".self_attn.")) return "attention";
  if (has(".mlp.gate.")) return "router";
  if (has(".mlp.shared_experts.")) return "shared_experts";
  if (has(".mlp.")) return "experts";  // routed experts, or a dense feed-forward
  return "";
}

}  // namespace minimind
