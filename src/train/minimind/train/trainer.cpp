#include "minimind/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "minimind/flops.h"
#include "minimind/train/analysis_writer.h"
#include "minimind/train/checkpointer.h"
#include "minimind/train/collapse_watcher.h"
#include "minimind/train/console.h"
#include "minimind/train/evaluator.h"
#include "minimind/train/interval_window.h"
#include "minimind/train/lr_schedule.h"
#include "minimind/train/run_log_observer.h"
#include "minimind/train/session.h"
#include "minimind/train/tensorboard_observer.h"
#include "minimind/train/train_step.h"
#include "minimind/util/stopwatch.h"

namespace minimind {
namespace {

TrainError non_finite_error(const StepStats& st, int64_t step, bool first_step,
                            const std::string& run_dir) {
  const auto last = latest_checkpoint(run_dir);
  return TrainError(
      fmt::format("non-finite {} at step {} (loss {}, lm {}, aux {}, z {}, grad norm {}); "
                  "stopping without saving. The last good checkpoint is {}.",
                  std::isfinite(st.loss) ? "gradient norm" : "loss", step, st.loss, st.lm_loss,
                  st.aux_loss, st.z_loss, st.grad_norm, last ? *last : std::string("(none yet)")),
      divergence_hint(first_step && !std::isfinite(st.loss), last));
}

struct StopDecision {
  bool stop = false;
  int signal = 0;
};

// Every rank stops at the same step when any of them was asked to: the maximum over ranks
// of [the after_step hook said stop, the stop flag's signal].
StopDecision agree_to_stop(const TrainOptions& o, int64_t step, MiniMindForCausalLM& model,
                           Distributed& dist) {
  const int hook = o.after_step && o.after_step(step, model) ? 1 : 0;
  torch::Tensor flags = torch::tensor({hook, o.stop ? o.stop->signal() : 0}, torch::kInt32);  // [2]
  dist.all_reduce_max(flags);
  const int signal = flags[1].item<int>();
  return {flags[0].item<int>() != 0 || signal != 0, signal};
}

// MiniMind's loop over the session, with the observers that watch it.
TrainResult run_loop(TrainSession* s, const Config& cfg, const TrainOptions& options,
                     Distributed& dist) {
  const bool main_rank = dist.is_main();
  const std::string& run_dir = s->run.path;
  TrainState& state = s->state;
  const TrainConfig& tc = cfg.train;

  // A finished run resumed: nothing to train, and no figures to report as new.
  if (s->run.checkpoint && state.step >= tc.max_steps) {
    if (main_rank)
      s->log->info(
          "'{}' is already complete: step {} of train.max_steps = {}; nothing to do (to train "
          "on, resume with --set train.max_steps=N)",
          run_dir, state.step, tc.max_steps);
    TrainResult done;
    done.run_dir = run_dir;
    done.step = done.start_step = state.step;
    done.tokens = done.start_tokens = state.tokens;
    return done;
  }

  // The pieces the loop notifies, in this order: the interval means (which the others
  // report), the console, rank 0's logs, collapse watcher and checkpointer, the evaluator
  // (every rank takes part), then the caller's observers.
  Observers bus;
  const FlopsPerToken flops = flops_per_token(cfg.model, cfg.data.max_seq_len);
  IntervalWindow window(cfg.log.interval, bus, dist.world_size() > 1, flops.total());
  ConsoleObserver console(*s->log, main_rank, cfg.log.console == "full");
  std::optional<RunLogObserver> logs;
  std::optional<CollapseWatcher> watcher;
  std::optional<Checkpointer> checkpointer;
  std::optional<Evaluator> evaluator;
  std::optional<TensorBoardObserver> tensorboard;
  bus.add(window);
  bus.add(console);
  if (main_rank) {
    bus.add(
        logs.emplace(run_dir, s->run.checkpoint ? state.step : -1, cfg.model.router_aux_loss_coef));
    if (!s->run.checkpoint && state.init_from) {
      const StartFrom& i = *state.init_from;
      InitRecord r;
      r.path = i.path, r.weights = i.weights, r.source_step = i.step;
      r.content_key = i.content_key;
      r.message = "weights from " + r.path + " (step " + std::to_string(r.source_step) +
                  " of its run, content key " + r.content_key + ")" +
                  (i.upcycled() ? ", upcycled into experts" : "");
      r.source_tokens = i.source_tokens, r.source_flops = i.source_flops;
      logs->write(r);
    }
    FlopsRecord f;
    f.step = state.step, f.seq = cfg.data.max_seq_len, f.per_token = flops.total();
    f.attention_projections = flops.attention_projections;
    f.attention_scores = flops.attention_scores, f.feed_forward = flops.feed_forward;
    f.shared_experts = flops.shared_experts, f.router = flops.router, f.lm_head = flops.lm_head;
    logs->write(f);
    std::string parts;
    for (const auto& [name, v] : flops.components())
      if (v > 0)
        parts +=
            fmt::format("{}{} {:.1f}%", parts.empty() ? "" : ", ", name, 100 * v / flops.total());
    s->log->info("training FLOPs per token: {:.4g} ({})", flops.total(), parts);
    bus.add(watcher.emplace(
        CollapseThresholds{cfg.log.collapse_max_share, cfg.log.collapse_dead_experts,
                           cfg.log.collapse_patience},
        UninformativeThresholds{cfg.log.uninformative_mi, cfg.log.collapse_patience,
                                tc.warmup_steps + cfg.log.interval},
        bus));
    bus.add(checkpointer.emplace(s->model, *s->optimizer, state, run_dir, tc, bus, s->parallel));
    // Before the evaluator: its file must exist for the evaluation before the first step.
    if (cfg.log.tensorboard) bus.add(tensorboard.emplace());
  }
  // The first expert group's other ranks send their experts to rank 0's checkpoints.
  if (!main_rank && s->ep && s->ep->in_first_group())
    bus.add(checkpointer.emplace(s->model, *s->optimizer, state, run_dir, tc, bus, s->parallel));
  if (s->val_tokens)
    bus.add(evaluator.emplace(s->model, *s->val_tokens, cfg, s->parallel, bus, s->val_chat));
  // After the last checkpoint and evaluation, before the caller's observers (the report
  // reads analysis.json).
  std::optional<AnalysisWriter> analysis;
  if (main_rank && s->val_tokens && cfg.model.use_moe)
    bus.add(analysis.emplace(s->model, *s->val_tokens, cfg));
  for (Observer* o : options.observers) bus.add(*o);
  // Live routing change: at most 8 rows of this rank's first batch (a pure function of the
  // data and seed, so the same probe after a resume), routed once with the weights the run
  // starts from (a resume restores the choices of the last log step instead), then at log
  // steps. Not with the random router, whose choices would draw from training's generator.
  std::optional<RoutingChange> routing_change;
  if (cfg.model.use_moe && cfg.model.router != RouterKind::random) {
    const Batch first = s->sampler->batch(0);  // [B, T]
    const int64_t rows = std::min<int64_t>(first.input_ids.size(0), 8);
    routing_change.emplace(first.input_ids.narrow(0, 0, rows), first.starts.defined()
                                                                   ? first.starts.narrow(0, 0, rows)
                                                                   : torch::Tensor());
    std::vector<LayerStats> none;
    routing_change->measure(s->model, none);
    bus.add(*routing_change);
  }

  if (s->run.checkpoint && state.monitor.is_object()) {
    try {
      bus.restore_state(state.monitor);
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(
          "checkpoint '" + *s->run.checkpoint + "': unreadable monitor state (" + e.what() + ")",
          "delete this checkpoint to resume from the one before");
    }
  }

  TrainResult result;
  result.run_dir = run_dir;
  result.start_step = state.step, result.start_tokens = state.tokens;
  bus.on_start({run_dir, main_rank, dist.world_size(), state.step, s->run.checkpoint.has_value(),
                s->log.get(), tc.max_steps});

  // The loop: one iteration per optimizer step.
  s->model->train();
  const Stopwatch loop;
  while (state.step < tc.max_steps) {
    const double lr = learning_rate_at(state.step, tc.max_steps, tc.learning_rate, tc.warmup_steps);
    // The router gradient by source and the experts' similarity are measured at log steps
    // only (they cost a little).
    const int64_t next = state.step + 1;
    const bool log_step = next % cfg.log.interval == 0 || next == tc.max_steps;
    StepOptions so;
    so.accumulation_steps = tc.accumulation_steps, so.grad_clip = tc.grad_clip, so.lr = lr;
    so.parallel = s->parallel;
    so.router_grads = so.expert_similarity = log_step && cfg.model.use_moe;
    // A frozen router has no gradient to measure, and its selection bias stays too.
    const auto& frozen = cfg.train.freeze;
    if (std::find(frozen.begin(), frozen.end(), "router") != frozen.end())
      so.router_grads = false, so.update_router_bias = false;
    so.shards = s->plan.shards;
    StepStats st = optimizer_step(
        s->model, *s->optimizer, [&] { return s->sampler->next(); }, so);
    if (routing_change && log_step && st.finite) routing_change->measure(s->model, st.layers);
    result.comm_seconds += st.comm_seconds;
    result.router_grad_seconds += st.router_grad_seconds;
    result.exchange_seconds += st.exchange_seconds;
    result.exchange_bytes += st.exchange_bytes;
    // A non-finite step changed no weight: stop with the last checkpoint intact.
    if (!st.finite)
      throw non_finite_error(st, state.step + 1, state.step == result.start_step, run_dir);
    ++state.step;
    state.tokens += st.tokens;
    state.loader_rows = s->sampler->position() * tc.batch_size * dist.world_size();
    result.step_losses.push_back(st.loss);

    const double seconds = loop.seconds();
    const StepInfo info{state.step,
                        tc.max_steps,
                        result.start_step,
                        state.tokens,
                        lr,
                        seconds,
                        state.elapsed_seconds + seconds,
                        &st};
    bus.on_step(info);
    const StopDecision stop = agree_to_stop(options, state.step, s->model, dist);
    bus.on_step_end(info, stop.stop || state.step == tc.max_steps);
    if (stop.stop) {
      result.interrupted = true;
      result.signal = stop.signal;
      break;
    }
  }
  result.step = state.step;
  result.tokens = state.tokens;
  result.seconds = loop.seconds();
  if (evaluator)
    result.first_val_loss = evaluator->first_loss(), result.last_val_loss = evaluator->last_loss();
  bus.on_end(result);
  dist.barrier();  // the last checkpoint is written before any rank reports success
  return result;
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& options) {
  Distributed single;  // a world of one when no ranks were given
  Distributed& dist = options.dist ? *options.dist : single;
  const std::string run_dir = options.out_dir.empty() ? "runs/" + cfg.run.name : options.out_dir;
  std::unique_ptr<TrainSession> s =
      open_session(cfg, run_dir, options.resume, options.overwrite, dist, options.stop);
  try {
    return run_loop(s.get(), cfg, options, dist);
  } catch (const std::exception& e) {
    log_failure(*s, e);  // train.log keeps the reason a run ended
    throw;
  }
}

}  // namespace minimind
