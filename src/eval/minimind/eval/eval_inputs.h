// What minimind-eval needs, found from what the user gave: a checkpoint directory, a run
// directory, or a bare MiniMind .pth with a config; the tokenizer; the documents.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "minimind/compute_plan.h"
#include "minimind/config.h"
#include "minimind/data/sft.h"
#include "minimind/data/token_file.h"
#include "minimind/data/tokenizer.h"
#include "minimind/model/minimind_model.h"

namespace minimind {

struct EvalModel {
  Config config;
  ComputePlan plan;  // how the model computes (load_eval_model plans it and builds the
                     // model with plan.products())
  MiniMindForCausalLM model{nullptr};
  std::optional<Tokenizer> tokenizer;
  std::string run_dir;  // "" for a bare .pth
  std::string weights;  // the .pth loaded
  int64_t step = 0;     // the checkpoint's optimizer steps (0 for a bare .pth)
};

// Where a model's weights are, from what a user named: a run directory (its newest
// checkpoint), a checkpoint directory (checkpoints/step_X/, its state.json read), or a bare
// .pth file. Throws CheckpointError for a missing path, a directory that is neither, a run
// without a complete checkpoint or a damaged state.json.
struct WeightsSource {
  std::string weights;           // the .pth
  std::string run_dir;           // the run it belongs to, "" for a bare .pth
  std::optional<Config> config;  // the checkpoint's own (none for a bare .pth)
  int64_t step = 0;              // the checkpoint's optimizer steps (0 for a bare .pth)
  // The training that made the weights (unset for a bare .pth): the run's tokens and FLOPs
  // (flops.h) up to the checkpoint, and those of the runs it started from in turn.
  std::optional<int64_t> trained_tokens;
  std::optional<double> trained_flops;
};
WeightsSource find_weights(const std::string& path);

// path: checkpoints/step_X/ (config from its state.json), a run directory (its newest
// checkpoint), or a .pth file (config_path required). The tokenizer is tokenizer_path, else
// the run's own copy (tokenizer.json or tokenizer.model), else the config's data.tokenizer;
// its vocabulary must equal model.vocab_size. The compute plan is made for `compute` on this
// machine before the model is built. Throws CheckpointError / WeightsError / TokenizerError /
// ConfigError.
struct EvalCompute {
  // --set on the checkpoint's config: run.* keys only (how to compute, "run.precision=bf16");
  // the model, data and training keys are the checkpoint's.
  std::vector<std::string> run_settings;
  Workload work;
};
EvalModel load_eval_model(const std::string& path, const std::string& config_path,
                          const std::string& tokenizer_path, bool need_tokenizer,
                          const EvalCompute& compute = {});

// Tokenises a JSONL corpus into a temporary token file (documents [bos] + ids + [eos]).
// max_docs < 0: all records.
TokenFile tokenize_corpus(const std::string& jsonl, const Tokenizer& tok,
                          const std::string& tmp_dir, int64_t max_docs);

// Chat data (a JSONL of conversations) into a temporary chat token file and its index
// (sft.h), for evaluate_chat. max_docs < 0: all conversations.
struct ChatTokens {
  TokenFile tokens;
  SftIndex index;
};
ChatTokens tokenize_chat_corpus(const std::string& jsonl, const Tokenizer& tok,
                                const std::string& tmp_dir, int64_t max_docs);

}  // namespace minimind
