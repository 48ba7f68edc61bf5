#include "minimind/train/trainer.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <thread>

#include "minimind/data/batcher.h"
#include "minimind/data/prepare.h"
#include "minimind/eval/evaluate.h"
#include "minimind/analysis/report.h"
#include "minimind/model/minimind_model.h"
#include "minimind/train/optim.h"
#include "minimind/run/checkpoint.h"
#include "minimind/train/lr_schedule.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/run/run_log.h"
#include "minimind/train/train_step.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/blas_check.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Set by SIGINT/SIGTERM; the loop checks it after every optimizer step.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs the handlers for the run and restores the previous ones afterwards.
class SignalGuard {
 public:
  SignalGuard() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Console + run_dir/train.log for the duration of the run. Ranks other than 0 of a
// multi-process run print only warnings and errors, tagged with their rank.
class LoggerGuard {
 public:
  LoggerGuard(const std::string& run_dir, bool append, int rank) : previous_(spdlog::default_logger()) {
    auto console = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
    std::shared_ptr<spdlog::logger> logger;
    if (rank == 0) {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(run_dir + "/train.log", !append);
      logger = std::make_shared<spdlog::logger>("minimind", spdlog::sinks_init_list{console, file});
    } else {
      logger = std::make_shared<spdlog::logger>("minimind", console);
      logger->set_level(spdlog::level::warn);
      logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
    }
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LoggerGuard() { spdlog::set_default_logger(previous_); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
};

// A status line rewritten in place on a terminal (not written to train.log).
class LiveLine {
 public:
  explicit LiveLine(bool enabled) : tty_(enabled && isatty(STDOUT_FILENO)) {}
  void show(const std::string& text) {
    if (!tty_) return;
    std::fprintf(stdout, "\r\033[K%s", text.c_str());
    std::fflush(stdout);
  }
  void clear() {
    if (!tty_) return;
    std::fprintf(stdout, "\r\033[K");
    std::fflush(stdout);
  }

 private:
  bool tty_;
};

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// Per MoE layer: expert counts summed over a window of steps.
using LayerCounts = std::vector<std::vector<int64_t>>;

// Sums one rank's share of an evaluation with the others' (every rank gets the total).
void reduce_eval_result(EvalResult& ev, const ModelConfig& m, Distributed& dist) {
  // A rank may have had no batch at all: size the counts from the config, not from ev.
  const size_t layers = m.use_moe ? static_cast<size_t>(m.num_hidden_layers) : 0;
  ev.expert_counts.resize(layers);
  for (auto& c : ev.expert_counts) c.resize(static_cast<size_t>(m.num_experts), 0);
  torch::Tensor loss = torch::full({1}, ev.loss_sum, torch::kFloat64);
  dist.all_reduce_sum(loss);
  std::vector<int64_t> flat{ev.tokens, ev.documents};
  for (const auto& c : ev.expert_counts) flat.insert(flat.end(), c.begin(), c.end());
  torch::Tensor sums = torch::tensor(flat, torch::kLong);  // [2 + layers * experts]
  dist.all_reduce_sum(sums);
  const int64_t* v = sums.data_ptr<int64_t>();
  ev.tokens = v[0], ev.documents = v[1];
  v += 2;
  for (auto& c : ev.expert_counts)
    for (auto& x : c) x = *v++;
  ev.loss_sum = loss.item<double>();
  ev.loss = ev.tokens > 0 ? ev.loss_sum / ev.tokens : NAN;
  ev.ppl = std::exp(ev.loss);
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& options) {
  TrainResult result;
  const std::string run_dir = options.out_dir.empty() ? "runs/" + cfg.run.name : options.out_dir;
  result.run_dir = run_dir;
  Distributed single;  // a world of one when no ranks were given
  Distributed& dist = options.dist ? *options.dist : single;
  const bool main_rank = dist.is_main();

  // ---- 1. The run directory: fresh, overwritten, or resumed. Only rank 0 writes it; the
  // others read the checkpoint rank 0 resumes from, after rank 0 has checked the directory.
  std::optional<std::string> checkpoint;
  if (main_rank) {
    if (options.resume) {
      checkpoint = latest_checkpoint(run_dir);
      if (!checkpoint)
        throw TrainError("--resume: no complete checkpoint in '" + run_dir +
                         "'; run without --resume to start training");
    } else if (fs::exists(run_dir) && !fs::is_empty(run_dir)) {
      if (!options.overwrite)
        throw TrainError("'" + run_dir + "' already holds a run; use --resume to continue it, "
                         "--overwrite to start it again, or --out DIR for a new directory");
      fs::remove_all(run_dir);
    }
    fs::create_directories(run_dir);
  }
  dist.barrier();
  if (!main_rank && options.resume) {
    checkpoint = latest_checkpoint(run_dir);
    if (!checkpoint) throw TrainError("--resume: rank " + std::to_string(dist.rank()) +
                                      " sees no checkpoint in '" + run_dir + "' (not shared with rank 0?)");
  }
  LoggerGuard logger(run_dir, options.resume, dist.rank());

  TrainState state;
  int64_t saved_batch_size = 0;  // of the checkpoint's run: converts an older data position
  if (checkpoint) {
    state = read_checkpoint_state(*checkpoint);
    Config saved = load_config_string(state.config_yaml, *checkpoint + "/state.json");
    saved_batch_size = saved.train.batch_size;
    validate_and_resolve(saved);
    std::vector<std::string> model_diff = config_differences(saved, cfg, "model");
    if (!model_diff.empty())
      throw CheckpointError("cannot resume '" + *checkpoint + "' with a different model (" +
                            fmt::format("{}", fmt::join(model_diff, "; ")) +
                            "); resume with the run's own config: " + run_dir + "/config.yaml");
    for (const auto& d : config_differences(saved, cfg))
      spdlog::warn("resuming with a changed setting: {}", d);
    spdlog::info("resuming {} from step {} ({} tokens seen)", *checkpoint, state.step, state.tokens);
  }
  if (main_rank) write_file_atomic((fs::path(run_dir) / "config.yaml").string(), config_to_yaml(cfg));
  state.config_yaml = config_to_yaml(cfg);

  const int threads = use_threads(cfg.run.threads, dist.env().local_world_size);

  // ---- 2. Data (prepared once, cached by content) and a self-contained run directory.
  // Rank 0 prepares; the others then find it in the cache.
  std::optional<PreparedData> prepared;
  if (main_rank) prepared = prepare_data(cfg.data, cfg.model.vocab_size, threads);
  dist.barrier();
  if (!main_rank) prepared = prepare_data(cfg.data, cfg.model.vocab_size, threads);
  const PreparedData& data = *prepared;
  if (main_rank)
    fs::copy_file(data.tokenizer_path, fs::path(run_dir) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
  TokenFile train_tokens = TokenFile::open(data.train_path);
  std::optional<TokenFile> val_tokens;
  if (!data.val_path.empty() && data.val_docs > 0) val_tokens = TokenFile::open(data.val_path);
  // Rank r draws global batches r, r + world, ...: a global batch of world x batch_size
  // rows per micro-step, the same rows for any split of them over ranks.
  BatchSampler sampler(train_tokens, cfg.data.mode, cfg.train.batch_size, cfg.data.max_seq_len,
                       static_cast<uint64_t>(cfg.run.seed), dist.rank(), dist.world_size());

  BlasReport blas = check_blas();
  if (!blas.ok)
    spdlog::warn("!!! matmul runs at {:.1f} GFLOP/s (BLAS: {}); expected > {:.0f}. Install an "
                 "optimised BLAS (`apt-get install libopenblas0-pthread`; scripts/install-deps.sh "
                 "does): training will be ~20x slower.", blas.gflops, blas.library, kMinSaneGflops);

  // ---- 3. Model and optimizer, fresh or from the checkpoint.
  torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  auto optimizer = make_optimizer(model->parameters(), cfg.train);
  if (checkpoint) {
    state = load_checkpoint(*checkpoint, model, *optimizer);
    state.config_yaml = config_to_yaml(cfg);
    // The position is stored in rows of the global stream: continue at the first row not
    // yet drawn, whatever the rank count and batch size now.
    const int64_t rows_per_batch = cfg.train.batch_size * dist.world_size();
    const int64_t rows = state.loader_rows >= 0 ? state.loader_rows : state.loader_batches * saved_batch_size;
    if (rows % rows_per_batch != 0)
      spdlog::warn("the checkpoint's data position ({} rows) is not a multiple of {} rows per "
                   "micro-step; {} rows are skipped", rows, rows_per_batch,
                   rows_per_batch - rows % rows_per_batch);
    sampler.set_position((rows + rows_per_batch - 1) / rows_per_batch);
  }
  dist.broadcast_from_main(model->parameters());  // every rank starts from rank 0's weights
  const ParamCount n = count_parameters(model);
  const ModelConfig& m = cfg.model;
  spdlog::info("model: {} layers, hidden {}, {}: {:.3f} M parameters ({:.3f} M active); "
               "{} threads{}, BLAS {:.0f} GFLOP/s",
               m.num_hidden_layers, m.hidden_size,
               m.use_moe ? fmt::format("MoE {} experts top-{}", m.num_experts, m.num_experts_per_tok)
                         : std::string("dense"),
               n.total / 1e6, n.active / 1e6, threads,
               dist.world_size() > 1 ? fmt::format(" per rank x {} ranks", dist.world_size()) : "",
               blas.gflops);

  const int64_t keep_until = checkpoint ? state.step : -1;
  auto log_path = [&](const char* name) { return main_rank ? (fs::path(run_dir) / name).string() : ""; };
  JsonlWriter metrics(log_path("metrics.jsonl"), keep_until);
  JsonlWriter loads(log_path("expert_load.jsonl"), keep_until);
  JsonlWriter events(log_path("events.jsonl"), keep_until);
  CollapseDetector detector({cfg.log.collapse_max_share, cfg.log.collapse_dead_experts,
                             cfg.log.collapse_patience});

  const int64_t A = cfg.train.accumulation_steps, T = cfg.train.max_steps;
  const double coef = m.router_aux_loss_coef;
  LiveLine live(main_rank);

  auto run_eval = [&](int64_t step) {
    const auto t0 = Clock::now();
    EvalResult ev = evaluate(model, *val_tokens, cfg.data.max_seq_len, cfg.train.batch_size, -1,
                             dist.rank(), dist.world_size());
    if (dist.world_size() > 1) reduce_eval_result(ev, m, dist);
    live.clear();
    spdlog::info("eval step {}: val_loss {:.4f} | ppl {:.2f} | {} tokens of {} documents in {:.1f} s",
                 step, ev.loss, ev.ppl, ev.tokens, ev.documents, seconds_since(t0));
    metrics.write({{"step", step}, {"tokens", state.tokens}, {"split", "eval"},
                   {"val_loss", ev.loss}, {"val_ppl", ev.ppl}, {"val_tokens", ev.tokens}});
    for (size_t l = 0; l < ev.expert_counts.size(); ++l) {
      RoutingMetrics rm = routing_metrics(ev.expert_counts[l]);
      loads.write(expert_load_record(step, static_cast<int64_t>(l), "eval", rm, -1));
      spdlog::info("  eval {}", load_row(static_cast<int64_t>(l), rm));
    }
    if (result.first_val_loss == 0) result.first_val_loss = ev.loss;
    result.last_val_loss = ev.loss;
  };
  if (val_tokens && !checkpoint) run_eval(0);
  if (!val_tokens) spdlog::warn("no validation split (data.val empty and data.val_fraction 0): no evaluation");

  // ---- 4. The loop: one iteration per optimizer step.
  SignalGuard signals;
  model->train();
  const auto loop_start = Clock::now();
  const int64_t first_step = state.step, first_tokens = state.tokens;
  LayerCounts window;  // counts since the last log line
  double win_loss = 0, win_lm = 0, win_aux = 0, win_gnorm = 0, win_comm = 0;
  int64_t win_steps = 0, win_tokens = 0;
  auto win_start = Clock::now();

  while (state.step < T) {
    const double lr = learning_rate_at(state.step, T, cfg.train.learning_rate, cfg.train.warmup_steps);
    StepStats st = optimizer_step(model, *optimizer, [&] { return sampler.next(); }, A,
                                  cfg.train.grad_clip, lr, &dist);
    result.comm_seconds += st.comm_seconds;
    const double loss = st.loss, lm = st.lm_loss, aux = st.aux_loss, gnorm = st.grad_norm;
    if (!st.finite) {
      live.clear();
      auto last = latest_checkpoint(run_dir);
      throw TrainError(fmt::format(
          "non-finite {} at step {} (loss {}, lm {}, aux {}, grad norm {}); stopping without "
          "saving. The last good checkpoint is {}. Try a lower train.learning_rate or "
          "train.grad_clip, then --resume.",
          std::isfinite(loss) ? "gradient norm" : "loss", state.step + 1, loss, lm, aux, gnorm,
          last ? *last : std::string("(none yet)")));
    }
    ++state.step;
    state.tokens += st.tokens;
    state.loader_rows = sampler.position() * cfg.train.batch_size * dist.world_size();
    result.step_losses.push_back(loss);
    const LayerCounts& step_counts = st.counts;
    const int64_t step_tokens = st.tokens;

    for (size_t l = 0; l < step_counts.size(); ++l)
      loads.write(expert_load_record(state.step, static_cast<int64_t>(l), "train",
                                     routing_metrics(step_counts[l]),
                                     coef > 0 ? st.layer_aux[l] / coef : -1));
    window.resize(step_counts.size());
    for (size_t l = 0; l < step_counts.size(); ++l) {
      window[l].resize(step_counts[l].size(), 0);
      for (size_t e = 0; e < step_counts[l].size(); ++e) window[l][e] += step_counts[l][e];
    }
    win_loss += loss, win_lm += lm, win_aux += aux, win_gnorm += gnorm, win_comm += st.comm_seconds;
    ++win_steps;
    win_tokens += step_tokens;

    const double elapsed = seconds_since(loop_start);
    const double eta = elapsed / (state.step - first_step) * (T - state.step);
    const double tok_s = win_tokens / std::max(1e-9, seconds_since(win_start));
    live.show(fmt::format("step {}/{} | loss {:.4f} | lm {:.4f} | aux {:.5f} | lr {:.2e} | grad {:.3f} | "
                          "{:.0f} tok/s | ETA {}",
                          state.step, T, loss, lm, aux, lr, gnorm, tok_s, duration(eta)));

    if (state.step % cfg.log.interval == 0 || state.step == T) {
      live.clear();
      const double w = static_cast<double>(win_steps);
      spdlog::info("step {}/{} | loss {:.4f} | lm {:.4f} | aux {:.5f} | lr {:.2e} | grad {:.3f} | "
                   "{:.0f} tok/s | ETA {}",
                   state.step, T, win_loss / w, win_lm / w, win_aux / w, lr, win_gnorm / w, tok_s,
                   duration(eta));
      nlohmann::json rec = {{"step", state.step}, {"tokens", state.tokens}, {"split", "train"},
                            {"loss", win_loss / w}, {"lm_loss", win_lm / w}, {"aux_loss", win_aux / w},
                            {"lr", lr}, {"grad_norm", win_gnorm / w}, {"tok_per_s", tok_s},
                            {"elapsed", state.elapsed_seconds + elapsed}};
      if (dist.world_size() > 1) rec["allreduce_ms"] = 1e3 * win_comm / w;
      metrics.write(rec);
      for (size_t l = 0; l < window.size(); ++l) {
        RoutingMetrics rm = routing_metrics(window[l]);
        spdlog::info("  {}", load_row(static_cast<int64_t>(l), rm));
        auto ev = detector.observe(static_cast<int64_t>(l), state.step, rm);
        if (ev && main_rank) {
          spdlog::warn("{}", ev->message);
          events.write({{"step", ev->step}, {"event", "collapse"}, {"layer", ev->layer},
                        {"since_step", ev->since_step}, {"expert", ev->expert},
                        {"max_share", ev->max_share}, {"dead_experts", ev->dead},
                        {"message", ev->message}});
        }
      }
      window.clear();
      win_loss = win_lm = win_aux = win_gnorm = win_comm = 0;
      win_steps = win_tokens = 0;
      win_start = Clock::now();
    }
    if (val_tokens && (state.step % cfg.train.eval_interval == 0 || state.step == T)) {
      run_eval(state.step);
      win_start = Clock::now();  // evaluation time is not training throughput
    }

    // Every rank stops at the same step when any of them was asked to (the maximum over
    // ranks of [stop requested, signal number]).
    torch::Tensor stop_flags = torch::tensor(
        {options.after_step && options.after_step(state.step, model) ? 1 : 0, g_stop_signal.load()},
        torch::kInt32);  // [2]
    dist.all_reduce_max(stop_flags);
    const int stop_signal = stop_flags[1].item<int>();
    const bool stop = stop_flags[0].item<int>() != 0 || stop_signal != 0;
    if (main_rank && (state.step % cfg.train.checkpoint_interval == 0 || state.step == T || stop)) {
      TrainState snapshot = state;
      snapshot.elapsed_seconds += seconds_since(loop_start);
      const std::string dir = save_checkpoint(run_dir, model, *optimizer, snapshot, cfg.train.keep_checkpoints);
      live.clear();
      spdlog::info("checkpoint {}", dir);
    }
    if (stop) {
      result.interrupted = true;
      result.signal = stop_signal;
      live.clear();
      spdlog::warn("stopped at step {}{}; continue with --resume", state.step,
                   result.signal ? fmt::format(" by signal {}", result.signal) : "");
      break;
    }
  }
  live.clear();
  if (main_rank) spdlog::info("report {}", write_report(run_dir));
  dist.barrier();  // the last checkpoint is written before any rank reports success
  result.step = state.step;
  result.tokens = state.tokens;
  result.seconds = seconds_since(loop_start);
  if (!result.interrupted)
    spdlog::info("done: {} steps, {} tokens in {} ({:.0f} tok/s){}", state.step - first_step,
                 state.tokens, duration(result.seconds),
                 (state.tokens - first_tokens) / std::max(1e-9, result.seconds),
                 val_tokens ? fmt::format("; val_loss {:.4f} -> {:.4f}", result.first_val_loss,
                                          result.last_val_loss)
                            : "");
  if (dist.world_size() > 1)
    spdlog::info("{} ranks: all-reduce of gradients and statistics {:.1f} ms per step ({:.1f} % of the loop)",
                 dist.world_size(), 1e3 * result.comm_seconds / std::max<int64_t>(1, state.step - first_step),
                 100 * result.comm_seconds / std::max(1e-9, result.seconds));
  return result;
}

}  // namespace minimind
