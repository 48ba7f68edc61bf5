#include "minimind/train/analysis_writer.h"

#include <filesystem>

#include "minimind/eval/analyze.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/checkpoint.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/stopwatch.h"

namespace fs = std::filesystem;

namespace minimind {

void AnalysisWriter::on_end(const TrainResult& r) {
  // An interrupted run stops at once; --analyze can be run on it later.
  if (r.interrupted || !start_.main_rank) return;
  const std::string& run_dir = start_.run_dir;
  const auto checkpoints = list_checkpoints(run_dir);
  const Stopwatch clock;
  EvalModel m;
  m.config = cfg_;
  m.model = model_;
  if (!model_->expert_shard().whole()) {
    // This rank holds some of the experts: the analysis runs on the whole model, read from
    // the final checkpoint (rank 0 just wrote it).
    if (checkpoints.empty() || checkpoints.back().first != r.step) {
      start_.log->info(
          "routing analysis skipped: no checkpoint of the final step to read the "
          "whole model from (minimind-eval analyze {} makes it)",
          run_dir);
      return;
    }
    torch::NoGradGuard no_grad;
    m.model = MiniMindForCausalLM(cfg_.model, model_->products());
    load_weights(m.model, checkpoints.back().second + "/model.pth");
  }
  m.run_dir = run_dir;
  m.step = r.step;
  m.weights = !checkpoints.empty() && checkpoints.back().first == r.step
                  ? checkpoints.back().second + "/model.pth"
                  : "the final model";
  const fs::path tok = run_tokenizer_file(run_dir);
  if (fs::exists(tok)) m.tokenizer = Tokenizer::from_file(tok.string());
  AnalyzeOptions o;
  o.sources.push_back({"validation", "", &val_});
  o.batch_size = cfg_.train.batch_size;
  o.checkpoints = checkpoints;
  o.keep_checkpoints = cfg_.train.keep_checkpoints;
  o.checkpoint_interval = cfg_.train.checkpoint_interval;
  o.in_run = true;
  const RoutingAnalysis a = analyze_routing(m, o);
  const std::string path = (fs::path(run_dir) / "analysis.json").string();
  write_file_atomic(path, nlohmann::json(a).dump());
  start_.log->info("routing analysis {} ({} validation tokens, {} checkpoints, {:.1f} s)", path,
                   a.tokens, a.saturation ? a.saturation->steps.size() : 1, clock.seconds());
}

}  // namespace minimind
