// At the end of a MoE run (rank 0): the routing analysis of the final model on the
// validation split, with router saturation over the kept checkpoints, written to
// run_dir/analysis.json for report.html (minimind-eval --analyze does more: other corpora,
// domains).
#pragma once

#include "minimind/config.h"
#include "minimind/data/token_file.h"
#include "minimind/model/minimind_model.h"
#include "minimind/train/observer.h"

namespace minimind {

class AnalysisWriter : public Observer {
 public:
  AnalysisWriter(MiniMindForCausalLM model, const TokenFile& val, const Config& cfg)
      : model_(std::move(model)), val_(val), cfg_(cfg) {}
  void on_start(const RunStart& s) override { start_ = s; }
  void on_end(const TrainResult& r) override;

 private:
  MiniMindForCausalLM model_;
  const TokenFile& val_;
  const Config& cfg_;
  RunStart start_;
};

}  // namespace minimind
