#include "minimind/train/console.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "minimind/run/routing_metrics.h"

namespace minimind {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

ConsoleObserver::ConsoleObserver(spdlog::logger& log, bool live, bool full)
    : log_(log), live_(live && isatty(STDERR_FILENO)), full_(full) {}

ConsoleObserver::~ConsoleObserver() {
  clear_status();
}

void ConsoleObserver::clear_status() {
  if (!status_shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  status_shown_ = false;
}

void ConsoleObserver::on_step(const StepInfo& s) {
  // The interval's line of this step was printed already (its news comes first) and
  // restarted the throughput: this step's tokens are in that line, not in the next one.
  if (logged_this_step_)
    logged_this_step_ = false;
  else
    tokens_ += s.stats->tokens;
  max_steps_ = s.max_steps;
  eta_ = s.loop_seconds / static_cast<double>(s.step - s.first_step) * (s.max_steps - s.step);
  if (!live_) return;
  const StepStats& st = *s.stats;
  const double tok_s = tokens_ > 0 ? tokens_ / std::max(1e-9, clock_.seconds()) : last_tok_s_;
  std::fprintf(stderr, "\r\033[K%s",
               fmt::format("step {}/{} | loss {:.4f} | lm {:.4f} | aux {:.5f} | lr {:.2e} | "
                           "grad {:.3f} | {:.0f} tok/s | ETA {}",
                           s.step, s.max_steps, st.loss, st.lm_loss, st.aux_loss, s.lr,
                           st.grad_norm, tok_s, format_duration(eta_))
                   .c_str());
  std::fflush(stderr);
  status_shown_ = true;
}

void ConsoleObserver::on_interval(const IntervalInfo& i) {
  clear_status();
  const TrainRecord& r = i.record;
  last_tok_s_ = r.tok_per_s;
  // z and dropped only when their method is on.
  const std::string lab = (r.z_loss ? fmt::format(" | z {:.5f}", *r.z_loss) : "") +
                          (r.dropped ? fmt::format(" | dropped {:.1f}%", 100 * *r.dropped) : "");
  if (full_) {
    // Padded rows (pad, sft): how many of those tokens were text.
    const std::string real =
        r.real_tok_per_s ? fmt::format(" ({:.0f} not padding)", *r.real_tok_per_s) : "";
    log_.info(
        "step {}/{} | loss {:.4f} | lm {:.4f} | aux {:.5f}{} | lr {:.2e} | grad {:.3f} | "
        "{:.0f} tok/s{} | ETA {}",
        r.step, max_steps_, r.loss, r.lm_loss, r.aux_loss, lab, r.lr, r.grad_norm, r.tok_per_s,
        real, format_duration(eta_));
  } else {
    // At most ~105 columns for a run of 10^6 steps; z and dropped on a line of their own.
    log_.info(
        "step {}/{}  loss {:.4f} (lm {:.4f} aux {:.5f})  lr {:.2e}  grad {:.3f}  "
        "{:.0f} tok/s  ETA {}",
        r.step, max_steps_, r.loss, r.lm_loss, r.aux_loss, r.lr, r.grad_norm, r.tok_per_s,
        format_duration(eta_));
    if (!lab.empty()) log_.info("  {}", lab.substr(3));
  }
  log_load_rows("", i.counts, &i);
  // IntervalWindow comes before this observer: the step's own on_step follows.
  logged_this_step_ = true;
}

void ConsoleObserver::on_eval(const EvalInfo& e) {
  clear_status();
  evaluated_ = true;
  const EvalRecord& r = e.record;
  log_.info("eval step {}: val_loss {:.4f} | ppl {:.2f} | {} tokens of {} documents in {:.1f} s",
            r.step, r.val_loss, r.val_ppl, r.val_tokens, e.documents, e.seconds);
  log_load_rows("eval ", e.counts);
}

void ConsoleObserver::log_load_rows(const char* prefix, const ExpertCounts& counts,
                                    const IntervalInfo* interval) {
  for (size_t l = 0; l < counts.layers.size(); ++l) {
    const RoutingMetrics m = routing_metrics(counts.layers[l]);
    if (!full_) {
      const std::optional<RouterInfo> router =
          l < counts.router.size() ? std::optional<RouterInfo>(counts.router_info(l))
                                   : std::nullopt;
      for (const std::string& line : compact_load_rows(static_cast<int64_t>(l), m, router))
        log_.info("  {}{}", prefix, line);
      continue;
    }
    std::string row = load_row(static_cast<int64_t>(l), m);
    if (l < counts.router.size()) row += "  " + router_row(counts.router_info(l));
    const LayerStats* stats =
        interval && l < interval->layers.size() ? &interval->layers[l] : nullptr;
    if (stats && stats->z) row += fmt::format("  z {:.2f}", *stats->z);
    if (stats && stats->grad_lm)
      row += fmt::format("  ∇lm {:.1e} ∇bal {:.1e}", *stats->grad_lm, *stats->grad_balance);
    if (stats && stats->expert_similarity_mean)
      row += fmt::format("  sim {:.3f} (max {:.3f})", *stats->expert_similarity_mean,
                         *stats->expert_similarity_max);
    log_.info("  {}{}", prefix, row);
  }
  // The status line's throughput counts from here: log lines and evaluations are not training.
  tokens_ = 0;
  clock_.restart();
}

void ConsoleObserver::on_collapse(const CollapseRecord& c) {
  clear_status();
  log_.warn("{}", c.message);
}

void ConsoleObserver::on_uninformative(const UninformativeRecord& u) {
  clear_status();
  log_.warn("{}", u.message);
}

void ConsoleObserver::on_checkpoint(const CheckpointInfo& c) {
  clear_status();
  log_.info("checkpoint {}", c.dir);
}

void ConsoleObserver::on_end(const TrainResult& r) {
  clear_status();
  if (r.interrupted) {
    log_.warn("stopped at step {}{}; continue with --resume", r.step,
              r.signal ? fmt::format(" by signal {}", r.signal) : "");
  } else {
    log_.info("done: {} steps, {} tokens in {} ({:.0f} tok/s){}", r.step - r.start_step, r.tokens,
              format_duration(r.seconds), (r.tokens - r.start_tokens) / std::max(1e-9, r.seconds),
              evaluated_
                  ? fmt::format("; val_loss {:.4f} -> {:.4f}", r.first_val_loss, r.last_val_loss)
                  : "");
  }
  if (r.router_grad_seconds > 0)
    log_.info("router gradient by source, measured at log steps: {:.2f} s ({:.2f} % of the loop)",
              r.router_grad_seconds, 100 * r.router_grad_seconds / std::max(1e-9, r.seconds));
  if (world_size_ > 1)
    log_.info(
        "{} ranks: all-reduce of gradients and statistics {:.1f} ms per step ({:.1f} % of "
        "the loop)",
        world_size_, 1e3 * r.comm_seconds / std::max<int64_t>(1, r.step - r.start_step),
        100 * r.comm_seconds / std::max(1e-9, r.seconds));
  if (r.exchange_seconds > 0) {
    const double steps = static_cast<double>(std::max<int64_t>(1, r.step - r.start_step));
    log_.info(
        "experts exchanged all-to-all (rank 0): {:.1f} ms per step ({:.1f} % of the loop), "
        "{:.2f} MB per step to and from other ranks (token rows per rank and layer: "
        "expert_load.jsonl, \"exchange\")",
        1e3 * r.exchange_seconds / steps, 100 * r.exchange_seconds / std::max(1e-9, r.seconds),
        static_cast<double>(r.exchange_bytes) / steps / 1e6);
  }
}

}  // namespace minimind
