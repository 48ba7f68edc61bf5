// minimind-eval --analyze: runs a MoE checkpoint over probe corpora (streamed, in bounded
// memory) and over the run's kept checkpoints, and returns the RoutingAnalysis of
// run/routing_analysis.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "minimind/data/token_file.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/run/routing_analysis.h"

namespace minimind {

// One probe corpus: a JSONL file (tokenised as it is read), or a token file (the run's
// validation split).
struct ProbeSource {
  std::string name;
  std::string jsonl;  // "" -> tokens
  const TokenFile* tokens = nullptr;
};

struct AnalyzeOptions {
  std::vector<ProbeSource> sources;  // one domain each
  int64_t batch_size = 16;
  int64_t max_docs = -1;             // per source; < 0: all
  int64_t passages = 3;              // token view: this many passages ...
  int64_t passage_tokens = 40;       // ... of at most this many tokens
  int64_t saturation_tokens = 8192;  // probe tokens compared across checkpoints
  // Saturation: the run's kept checkpoints, oldest first (the analysed model is the final
  // one); fewer than 2 -> no saturation curve and a note saying how to get one.
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  bool in_run = false;              // the model came from a run directory
  int64_t keep_checkpoints = 0;     // the run's train.keep_checkpoints and
  int64_t checkpoint_interval = 0;  // train.checkpoint_interval, for the note
  // Called now and then with a progress line (and "" at the end).
  std::function<void(const std::string&)> progress;
};

// Throws ConfigError for a dense model ("nothing to analyse"), DataError for a probe corpus
// without usable documents (naming the file).
RoutingAnalysis analyze_routing(EvalModel& m, const AnalyzeOptions& options);

}  // namespace minimind
