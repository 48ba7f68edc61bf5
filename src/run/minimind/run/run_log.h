// The run directory's logs, defined once. Every record the tool writes, its JSON form, the
// writer the trainer uses and the reader behind --inspect, the report and the tests:
//
//   metrics.jsonl      TrainRecord ("split": "train", one per log interval) and
//                      EvalRecord ("split": "eval", one per evaluation)
//   expert_load.jsonl  LoadRecord, one per (step, MoE layer) and per (evaluation, layer)
//   events.jsonl       CollapseRecord ("event": "collapse"), UninformativeRecord
//                      ("event": "uninformative"), InitRecord ("event": "init_from")
//
// minimind-eval --json prints an EvalSummary (with LoadRecords) in the same way.
//
// Each record names its fields once, in fields(); writing and reading both walk that
// list, so a field cannot be written under one name and read under another. Reading a line
// that lacks a field, or holds it with another type, is a DataError naming the file, line
// and field. New metrics are added as std::optional fields: written as null when unset,
// read as unset when null or missing, so run directories written before them still read.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "minimind/model/layer_stats.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/util/json_fields.h"

namespace minimind {

// metrics.jsonl, split "train": means over the steps of one log interval.
struct TrainRecord {
  int64_t step = 0;                            // the interval's last optimizer step
  int64_t tokens = 0;                          // training tokens seen so far (all ranks)
  std::optional<double> flops;                 // training FLOPs so far (flops.h; unset in old logs)
  double loss = 0, lm_loss = 0, aux_loss = 0;  // loss = lm_loss + aux_loss (summed aux)
  double lr = 0;                               // at the last step
  double grad_norm = 0;                        // before clipping
  double tok_per_s = 0;                        // training tokens per second (eval excluded)
  // of which not padding, when some were (data.mode pad and sft)
  std::optional<double> real_tok_per_s;
  double elapsed = 0;                  // training seconds of the run so far
  std::optional<double> allreduce_ms;  // per step, multi-process runs only
  std::optional<double> z_loss;        // router z-loss (summed over layers), when it is on
  std::optional<double> dropped;       // fraction of assignments capacity dropped, when it is on

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("split", Tag{"train"});
    f("step", r.step), f("tokens", r.tokens), f("flops", r.flops), f("loss", r.loss);
    f("lm_loss", r.lm_loss);
    f("aux_loss", r.aux_loss), f("lr", r.lr), f("grad_norm", r.grad_norm);
    f("tok_per_s", r.tok_per_s), f("real_tok_per_s", r.real_tok_per_s);
    f("elapsed", r.elapsed), f("allreduce_ms", r.allreduce_ms);
    f("z_loss", r.z_loss), f("dropped", r.dropped);
  }
};

// metrics.jsonl, split "eval": one evaluation of the validation split.
struct EvalRecord {
  int64_t step = 0, tokens = 0;  // when: optimizer steps and training tokens so far
  double val_loss = 0, val_ppl = 0;
  int64_t val_tokens = 0;       // predicted positions
  std::optional<double> flops;  // training FLOPs so far (flops.h; unset in old logs)

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("split", Tag{"eval"});
    f("step", r.step), f("tokens", r.tokens), f("val_loss", r.val_loss);
    f("val_ppl", r.val_ppl), f("val_tokens", r.val_tokens), f("flops", r.flops);
  }
};

// expert_load.jsonl: one MoE layer's load, with every metric of docs/moe-routing.md.
struct LoadRecord {
  int64_t step = 0, layer = 0;
  std::string split;            // "train": one optimizer step; "eval": one evaluation
  std::vector<int64_t> counts;  // c_e
  std::vector<double> share;    // c_e / sum c
  double max_vio = 0, cv = 0, entropy = 0, effective_experts = 0, max_share = 0;
  int64_t max_expert = 0;
  int64_t dead = 0;                   // number of experts with no token
  std::vector<int64_t> dead_experts;  // which
  // The step's per-layer statistics (training records; null when unset): the fields
  // layer_stats.h logs as they are (z, seq_max_vio, bias, grad_lm, grad_balance) under their
  // own names, and two derived from the others:
  LayerStats stats;
  std::optional<double> aux_unscaled;  // the layer's aux loss / coef (training, coef > 0)
  std::optional<double> dropped;       // fraction of the layer's assignments capacity dropped
  // Expert parallelism: the step's per-rank overload factor (Megatron-LM #4110), the most
  // rows any rank's experts received over the mean rows a rank routed (1 = even), from
  // `exchange`.
  std::optional<double> overload;
  // Is the router learning? (RouterInfo; learned routers only, training and evaluation)
  std::optional<double> token_entropy, marginal_entropy, mi, confidence;

  static LoadRecord make(int64_t step, int64_t layer, std::string split, const RoutingMetrics& m,
                         std::optional<double> aux_unscaled = {});
  void set_router(const RouterInfo& r);  // leaves the fields unset when r has no tokens

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("step", r.step), f("layer", r.layer), f("split", r.split), f("counts", r.counts);
    f("share", r.share), f("max_vio", r.max_vio), f("cv", r.cv), f("entropy", r.entropy);
    f("effective_experts", r.effective_experts), f("max_share", r.max_share);
    f("max_expert", r.max_expert), f("dead", r.dead), f("dead_experts", r.dead_experts);
    f("aux_unscaled", r.aux_unscaled), f("dropped", r.dropped), f("overload", r.overload);
    LayerStats::fields(
        [&](const char* name, Combine, Logged logged, auto& v) {
          if (logged == Logged::as_is) f(name, v);
        },
        r.stats);
    f("token_entropy", r.token_entropy);
    f("marginal_entropy", r.marginal_entropy), f("mi", r.mi), f("confidence", r.confidence);
  }
};

// events.jsonl: a layer that stayed over the collapse thresholds for log.collapse_patience
// log intervals.
struct CollapseRecord {
  int64_t step = 0;        // when the warning fired
  int64_t since_step = 0;  // first step of the streak
  int64_t layer = 0;
  int64_t expert = 0;  // the expert with the largest share
  double max_share = 0;
  std::vector<int64_t> dead_experts;
  std::string message;  // the warning as printed

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("event", Tag{"collapse"});
    f("step", r.step), f("since_step", r.since_step), f("layer", r.layer);
    f("expert", r.expert), f("max_share", r.max_share), f("dead_experts", r.dead_experts);
    f("message", r.message);
  }
};

// events.jsonl: a layer whose routing information MI stayed below log.uninformative_mi for
// log.collapse_patience log intervals: the router's probabilities hardly depend on the
// token, however balanced its counts look (MiniMind #858).
struct UninformativeRecord {
  int64_t step = 0, since_step = 0, layer = 0;
  double mi = 0, token_entropy = 0, threshold = 0;
  double max_share = 0;  // of the counts: near 1/E is "balanced but uninformative"
  std::optional<double> grad_lm, grad_balance;  // router gradient by source, last log step
  std::string message;

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("event", Tag{"uninformative"});
    f("step", r.step), f("since_step", r.since_step), f("layer", r.layer), f("mi", r.mi);
    f("token_entropy", r.token_entropy), f("threshold", r.threshold);
    f("max_share", r.max_share), f("grad_lm", r.grad_lm), f("grad_balance", r.grad_balance);
    f("message", r.message);
  }
};

// events.jsonl: the run started from trained weights (train.init_from), at step 0.
struct InitRecord {
  int64_t step = 0;
  std::string path;         // as given
  std::string weights;      // the .pth read
  int64_t source_step = 0;  // its checkpoint's step (0 for a bare .pth)
  std::string content_key;  // XXH3-128 of the .pth's bytes
  std::string message;      // as logged
  // The training that made the weights: tokens and FLOPs of the source's run and of the
  // runs it started from in turn (unset for a bare .pth, whose history is unknown).
  std::optional<int64_t> source_tokens;
  std::optional<double> source_flops;

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("event", Tag{"init_from"});
    f("step", r.step), f("path", r.path), f("weights", r.weights);
    f("source_step", r.source_step), f("content_key", r.content_key), f("message", r.message);
    f("source_tokens", r.source_tokens), f("source_flops", r.source_flops);
  }
};

// state.json's "init_from": the weights a run started from (train.init_from), kept in every
// checkpoint of the run. Fields added later are optional, so that earlier checkpoints read.
struct StartFrom {
  std::string path;                 // as given
  std::optional<std::string> mode;  // "copy" or "upcycle" (unset before 2026-12-05: copy)
  std::optional<double> upcycle_drop;
  std::string weights;      // the .pth read
  int64_t step = 0;         // its checkpoint's step (0 for a bare .pth)
  std::string content_key;  // XXH3-128 of the .pth's bytes
  // The training that made the weights, the source's own sources included (unset for a bare
  // .pth, whose history is unknown).
  std::optional<int64_t> source_tokens;
  std::optional<double> source_flops;
  // Upcycling: how the dense feed-forward was cut and scaled (weights_io.h, UpcyclePlan),
  // the units each expert redrew, and what the start measured: the logits' gap to the dense
  // model's and whether step 0 computes its function.
  std::optional<bool> upcycle_scaling;
  std::optional<int64_t> granularity, shared_granularity;
  std::optional<double> routed_scale, shared_scale;
  std::optional<int64_t> units_redrawn;
  std::optional<double> output_gap;
  std::optional<bool> preserves_function;

  bool upcycled() const { return mode && *mode == "upcycle"; }

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("path", r.path), f("mode", r.mode), f("upcycle_drop", r.upcycle_drop);
    f("weights", r.weights), f("step", r.step), f("content_key", r.content_key);
    f("source_tokens", r.source_tokens), f("source_flops", r.source_flops);
    f("upcycle_scaling", r.upcycle_scaling), f("granularity", r.granularity);
    f("shared_granularity", r.shared_granularity), f("routed_scale", r.routed_scale);
    f("shared_scale", r.shared_scale), f("units_redrawn", r.units_redrawn);
    f("output_gap", r.output_gap), f("preserves_function", r.preserves_function);
  }
};

// events.jsonl: what one trained token costs, by component (flops.h), written when a run
// starts; metrics.jsonl's `flops` is the running total.
struct FlopsRecord {
  int64_t step = 0;
  int64_t seq = 0;  // the sequence length attention is counted at
  double per_token = 0;
  double attention_projections = 0, attention_scores = 0, feed_forward = 0, shared_experts = 0,
         router = 0, lm_head = 0;

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("event", Tag{"flops"});
    f("step", r.step), f("seq", r.seq), f("per_token", r.per_token);
    f("attention_projections", r.attention_projections);
    f("attention_scores", r.attention_scores), f("feed_forward", r.feed_forward);
    f("shared_experts", r.shared_experts), f("router", r.router), f("lm_head", r.lm_head);
  }
};

// minimind-eval --json: loss and expert load of a checkpoint on a corpus.
struct EvalSummary {
  double loss = 0, ppl = 0;
  int64_t tokens = 0, documents = 0;  // predicted positions; documents evaluated
  double seconds = 0, tokens_per_s = 0;
  std::string weights;                  // the .pth evaluated
  std::vector<LoadRecord> expert_load;  // split "eval", one per MoE layer
  // The whole corpus: its predictable positions (all tokens but each document's bos) and
  // documents, so that tokens < corpus_tokens says what was left out (--max-docs,
  // --truncate). Unset in summaries written before they existed.
  std::optional<int64_t> corpus_tokens, corpus_documents;
  std::optional<bool> truncated;  // --truncate: long documents were cut to their first window

  template <class R, class F>
  static void fields(R& r, F&& f) {
    f("loss", r.loss), f("ppl", r.ppl), f("tokens", r.tokens), f("documents", r.documents);
    f("seconds", r.seconds), f("tokens_per_s", r.tokens_per_s), f("weights", r.weights);
    f("expert_load", r.expert_load);
    f("corpus_tokens", r.corpus_tokens), f("corpus_documents", r.corpus_documents);
    f("truncated", r.truncated);
  }
};

// Every record type, for code that does the same for each (X is a macro taking the type).
#define MINIMIND_RUN_LOG_RECORDS(X) \
  X(TrainRecord)                    \
  X(EvalRecord)                     \
  X(LoadRecord)                     \
  X(CollapseRecord) X(UninformativeRecord) X(InitRecord) X(FlopsRecord) X(EvalSummary) X(StartFrom)

// JSON form of each record (nlohmann's to_json/from_json, so they nest in vectors). from_json
// throws DataError naming the field.
#define MINIMIND_DECLARE_JSON(Record)               \
  void to_json(nlohmann::json& j, const Record& r); \
  void from_json(const nlohmann::json& j, Record& r);
MINIMIND_RUN_LOG_RECORDS(MINIMIND_DECLARE_JSON)
#undef MINIMIND_DECLARE_JSON

// Appends records to a run directory's three logs, one line each, flushed.
class RunLogWriter {
 public:
  // run_dir "": writes nothing (ranks other than 0). keep_until_step >= 0 (a resumed run):
  // lines of later steps, logged after the checkpoint the run continues from, are dropped
  // first; < 0: the logs start empty.
  RunLogWriter(const std::string& run_dir, int64_t keep_until_step);
  void write(const TrainRecord& r) { append(metrics_, r); }
  void write(const EvalRecord& r) { append(metrics_, r); }
  void write(const LoadRecord& r) { append(loads_, r); }
  void write(const CollapseRecord& r) { append(events_, r); }
  void write(const UninformativeRecord& r) { append(events_, r); }
  void write(const InitRecord& r) { append(events_, r); }
  void write(const FlopsRecord& r) { append(events_, r); }

 private:
  static void open(std::ofstream& out, const std::string& path, int64_t keep_until_step);
  static void append(std::ofstream& out, const nlohmann::json& j);
  std::ofstream metrics_, loads_, events_;
};

// A run directory's logs, read back.
struct RunLogs {
  std::string run_dir;
  std::vector<TrainRecord> train;
  std::vector<EvalRecord> eval;
  std::map<int64_t, std::vector<LoadRecord>> train_load;  // layer -> one record per step
  std::map<int64_t, std::vector<LoadRecord>> eval_load;   // layer -> one per evaluation
  std::vector<CollapseRecord> collapses;
  std::vector<UninformativeRecord> uninformative;
  std::optional<InitRecord> init;    // the weights the run started from, if not random
  std::optional<FlopsRecord> flops;  // the cost of a trained token (the newest start's)
  int64_t last_step() const;
};

// Reads metrics.jsonl, expert_load.jsonl and events.jsonl. Works on a run still being
// written: an unfinished last line is left out. Throws DataError when the directory has no
// metrics.jsonl, or naming file, line and field when a line does not hold its record.
RunLogs read_run_logs(const std::string& run_dir);

// Sum of the counts of the last `steps` records of one layer.
std::vector<int64_t> recent_counts(const std::vector<LoadRecord>& records, size_t steps);

}  // namespace minimind
