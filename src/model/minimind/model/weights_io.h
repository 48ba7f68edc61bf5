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
// model of the same size. Every tensor but the feed-forward's is copied by name; the
// routers and their selection biases keep their initial values. Every routed and shared
// expert of layer i starts from layer i's dense feed-forward (model.layers.i.mlp.
// {gate,up,down}_proj.weight): the whole of it when the experts are as wide, else (fine-
// grained experts, G = intermediate_size / expert width) expert j takes slice j mod G of the
// intermediate units, and the router rows of each group of G experts are made equal
// ("virtual groups", He et al., "Upcycling Large Language Models into Mixture of Experts",
// 2024). `scaling`: the experts' down_proj is scaled so that the feed-forward's output equals
// the dense one when the router's scores tie (He et al.'s weight scaling, put on the linear
// down_proj so that it is exact for SwiGLU). Throws WeightsError listing the first
// mismatches, for a source that already holds experts, and for widths that do not divide.
struct UpcyclePlan {
  int64_t granularity = 1;         // G: dense width / routed expert width
  int64_t shared_granularity = 1;  // the same for the shared experts
  double routed_scale = 1.0;       // on each routed expert's down_proj
  double shared_scale = 1.0;       // on each shared expert's down_proj
  // Why the construction may make step 0 compute something other than the dense model (""
  // : nothing known; upcycled_output_gap measures it).
  std::string not_preserved;
};
UpcyclePlan load_weights_upcycled(MiniMindForCausalLM& model, const std::string& path,
                                  bool scaling = false);

// Drop-Upcycling (Nakamura et al., "Drop-Upcycling", ICLR 2025), after
// load_weights_upcycled: each routed expert re-initialises round(ratio * I) of its I
// intermediate units, a set of its own drawn from torch's default generator: those rows of
// gate_proj and up_proj and columns of down_proj are drawn from a normal distribution with
// the mean and standard deviation of the matrix they were copied from. The experts then
// differ from the start, while keeping the rest of the dense knowledge.
// Returns the units redrawn per expert (round(ratio * I): 0 for a ratio too small to redraw
// any, I for 1).
int64_t drop_upcycle(MiniMindForCausalLM& model, double ratio);

// How far an upcycled MoE model computes from the dense model whose weights are at
// dense_path: the largest |difference| of their logits on a fixed probe (4 rows of 32 token
// ids drawn from a generator of its own), over the largest |dense logit|. Both run in eval
// mode on the current products; torch's default generator is left as it was (a random
// router draws from it). A relative gap within kUpcycleSameFunction is float rounding: step 0
// computes the dense model's function.
double upcycled_output_gap(MiniMindForCausalLM& moe, const std::string& dense_path);
inline constexpr double kUpcycleSameFunction = 1e-5;

// Whether a state-dict name is a hash layer's table of expert ids (gate.tid2eid [V, k]).
bool is_hash_table(const std::string& name);

// Reads any torch.save'd {str: tensor} dict (fixtures, weights). Throws WeightsError.
NamedTensors read_tensor_dict(const std::string& path);

// Reads a torch.save'd object of any kind (nested dicts of tensors, numbers, strings).
c10::IValue read_pickle(const std::string& path);

}  // namespace minimind
