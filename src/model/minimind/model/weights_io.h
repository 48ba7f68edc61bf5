// MiniMind-format weights: a plain {name: tensor} dict in the file format of Python's
// torch.save, readable with torch.load and MiniMind's load_state_dict(strict=True).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "minimind/error.h"
#include "minimind/model/minimind_model.h"

namespace minimind {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Every parameter under its MiniMind name; with tied embeddings both
// model.embed_tokens.weight and lm_head.weight are present (as MiniMind saves them).
NamedTensors state_dict(const MiniMindForCausalLM& model);

// Writes the weights (cast to dtype) to a temporary file and renames it into place,
// so a crash never leaves a half-written file under `path`.
void save_weights(const MiniMindForCausalLM& model, const std::string& path,
                  torch::Dtype dtype = torch::kFloat32);
// The same for tensors gathered elsewhere (a whole model from ranks holding parts of it).
void save_weights(const NamedTensors& tensors, const std::string& path,
                  torch::Dtype dtype = torch::kFloat32);

// Loads a MiniMind-format file (fp16, bf16 or fp32) into the model. Names and shapes
// must match exactly; otherwise throws WeightsError listing the first mismatches. A model
// holding some of the routed experts (expert parallelism) takes its own from the file and
// leaves the others'.
void load_weights(MiniMindForCausalLM& model, const std::string& path);

// Sparse upcycling (Komatsuzaki et al., 2023): loads a dense model's weights into an MoE
// model of the same size. Every routed and shared expert of layer i gets a copy of layer
// i's dense feed-forward (model.layers.i.mlp.{gate,up,down}_proj.weight); the routers and
// their selection biases keep their initial values; every other tensor is copied by name.
// The experts must be as wide as the dense feed-forward (moe_intermediate_size =
// intermediate_size). Throws WeightsError listing the first mismatches, and for a source
// that already holds experts.
void load_weights_upcycled(MiniMindForCausalLM& model, const std::string& path);

// Drop-Upcycling (Nakamura et al., "Drop-Upcycling", ICLR 2025), after
// load_weights_upcycled: each routed expert re-initialises round(ratio * I) of its I
// intermediate units, a set of its own drawn from torch's default generator: those rows of
// gate_proj and up_proj and columns of down_proj are drawn from a normal distribution with
// the mean and standard deviation of the matrix they were copied from. The experts then
// differ from the start, while keeping the rest of the dense knowledge.
void drop_upcycle(MiniMindForCausalLM& model, double ratio);

// Reads any torch.save'd {str: tensor} dict (fixtures, weights). Throws WeightsError.
NamedTensors read_tensor_dict(const std::string& path);

// Reads a torch.save'd object of any kind (nested dicts of tensors, numbers, strings).
c10::IValue read_pickle(const std::string& path);

}  // namespace minimind
