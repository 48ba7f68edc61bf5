// minimind-export: a checkpoint as files other runtimes read. GGUF for llama.cpp (and what
// is built on it: Ollama, LM Studio, node-llama-cpp), or a Hugging Face directory for
// transformers' Qwen3 / Qwen3-MoE classes. What the target cannot compute exactly is
// refused, naming the config key and why (docs/export.md).
#pragma once

#include <string>

#include "minimind/config.h"
#include "minimind/eval/eval_inputs.h"

namespace minimind {

enum class ExportFormat { gguf, hf };
enum class ExportDtype { f32, f16, bf16 };  // of the weight matrices; norms stay float32

// llama.cpp's architecture whose graph computes this model: "qwen3" (dense), "qwen3moe"
// (softmax routing with renormalised top-k and no lab extras) or "hy_v3" (any other learned
// router: no renormalisation, sigmoid scores, a selection bias, shared experts). Throws
// ConfigError for what llama.cpp cannot compute (capacity, the random and hash routers).
std::string gguf_architecture(const ModelConfig& m);

// The transformers class of this model; throws ConfigError for the balancing lab's options
// that Qwen3 has no equivalent of.
std::string hf_architecture(const ModelConfig& m);

// Writes the model (with its tokenizer) to `out`: a .gguf file, or a directory holding
// config.json, generation_config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json and tokenizer.model. An existing `out` is refused unless
// `overwrite`. Everything is written under a temporary name and renamed into place, so a
// failure (a full disk) leaves no partial file and the earlier `out` as it was.
void export_model(const EvalModel& m, ExportFormat format, ExportDtype dtype,
                  const std::string& out, bool overwrite);

}  // namespace minimind
