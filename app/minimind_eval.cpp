// minimind-eval: loss/perplexity and expert load of a checkpoint on any corpus, text
// generation, and inspection of a run's expert-load logs (terminal and report.html).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "minimind/analysis/compare.h"
#include "minimind/analysis/inspect.h"
#include "minimind/analysis/report.h"
#include "minimind/analysis/routing_page.h"
#include "minimind/data/prepare.h"
#include "minimind/error.h"
#include "minimind/eval/analyze.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/eval/evaluate.h"
#include "minimind/eval/generate.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/run/run_log.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/malloc_tuning.h"
#include "minimind/util/stopwatch.h"

namespace {

struct Args {
  std::string checkpoint, config, tokenizer, data, prompt, inspect, report, analyze;
  std::vector<std::string> data_list;  // --data, repeatable (NAME=FILE for --analyze)
  std::string analyze_out;
  std::vector<std::string> compare;  // run directories
  std::string compare_out = "compare.html";
  int64_t max_docs = -1, batch_size = 0, threads = 0;
  bool json = false;
  minimind::GenerateOptions gen;
};

// The run's data, prepared (cached), when it has a validation split; `purpose` ends the
// error's hint.
minimind::PreparedData validation_split(const minimind::Config& cfg, int threads,
                                        const std::string& purpose) {
  using namespace minimind;
  PreparedData d = prepare_data(cfg.data, cfg.model.vocab_size, threads);
  if (d.val_path.empty() || d.val_docs == 0)
    throw DataError("the run has no validation split; pass --data FILE.jsonl" + purpose);
  return d;
}

int evaluate_command(const Args& a, minimind::EvalModel& m, int threads) {
  using namespace minimind;
  const Config& cfg = m.config;
  std::optional<TokenFile> docs;
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("minimind-eval-" + std::to_string(::getpid())))
          .string();
  if (!a.data.empty()) {
    if (!m.tokenizer) throw TokenizerError("--data needs a tokenizer: pass --tokenizer FILE.model");
    docs = tokenize_corpus(a.data, *m.tokenizer, tmp, a.max_docs);
  } else {
    docs = TokenFile::open(validation_split(cfg, threads, "").val_path);
  }
  const int64_t batch = a.batch_size > 0 ? a.batch_size : cfg.train.batch_size;
  const Stopwatch clock;
  EvalResult r = evaluate(m.model, *docs, cfg.data.max_seq_len, batch, a.max_docs);
  const double secs = clock.seconds();
  std::filesystem::remove_all(tmp);

  EvalSummary summary{r.loss, r.ppl, r.tokens, r.documents, secs, r.tokens / secs, m.weights, {}};
  spdlog::info(
      "loss {:.4f} | ppl {:.2f} | {} predicted tokens of {} documents | {:.1f} s ({:.0f} tokens/s)",
      r.loss, r.ppl, r.tokens, r.documents, secs, r.tokens / secs);
  for (size_t l = 0; l < r.expert_counts.layers.size(); ++l) {
    const RoutingMetrics rm = routing_metrics(r.expert_counts.layers[l]);
    const RouterInfo ri = r.expert_counts.router_info(l);
    spdlog::info("  {}{}  counts {}", load_row(static_cast<int64_t>(l), rm),
                 ri.tokens > 0 ? "  " + router_row(ri) : "", fmt::join(rm.counts, " "));
    LoadRecord rec = LoadRecord::make(m.step, static_cast<int64_t>(l), "eval", rm);
    rec.set_router(ri);
    summary.expert_load.push_back(rec);
  }
  if (a.json) std::cout << nlohmann::json(summary).dump() << std::endl;
  return 0;
}

// --analyze: the routing analysis of a MoE checkpoint on probe corpora (default: the run's
// validation split), as a page and optionally JSON.
int analyze_command(const Args& a, minimind::EvalModel& m, int threads) {
  using namespace minimind;
  AnalyzeOptions o;
  std::optional<TokenFile> val;
  for (const std::string& d : a.data_list) {
    // NAME=FILE, or FILE (named after its file name).
    const size_t eq = d.find('=');
    const bool named = eq != std::string::npos && eq > 0 && !std::filesystem::exists(d);
    const std::string file = named ? d.substr(eq + 1) : d;
    const std::string name = named ? d.substr(0, eq) : std::filesystem::path(d).stem().string();
    if (!std::filesystem::exists(file))
      throw DataError("probe corpus '" + file + "' does not exist (--data " + d + ")");
    if (std::filesystem::is_directory(file))
      throw DataError("probe corpus '" + file + "' is a directory, not a JSONL file (--data " + d +
                      ")");
    o.sources.push_back({name, file, nullptr});
  }
  if (o.sources.empty()) {
    const PreparedData d = validation_split(m.config, threads, " to analyse");
    val = TokenFile::open(d.val_path);
    o.sources.push_back({"validation", "", &*val});
    // A bare .pth without --tokenizer: the tokenizer its data preparation used.
    if (!m.tokenizer && !d.tokenizer_path.empty()) {
      m.tokenizer = Tokenizer::from_file(d.tokenizer_path);
      m.tokenizer->check_vocab_size(m.config.model.vocab_size);
    }
  }
  if (!m.tokenizer)
    spdlog::warn("no tokenizer: tokens are shown as #id (pass --tokenizer FILE.model)");
  o.batch_size = a.batch_size > 0 ? a.batch_size : m.config.train.batch_size;
  o.max_docs = a.max_docs;
  o.keep_checkpoints = m.config.train.keep_checkpoints;
  o.checkpoint_interval = m.config.train.checkpoint_interval;
  o.in_run = !m.run_dir.empty();
  if (o.in_run) o.checkpoints = list_checkpoints(m.run_dir);
  const bool tty = isatty(STDERR_FILENO);
  // A line rewritten in place on a terminal; else a log line every 30 s.
  auto last = std::make_shared<Stopwatch>();
  o.progress = [tty, last](const std::string& line) {
    if (tty) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
    } else if (!line.empty() && last->seconds() >= 30) {
      spdlog::info("{}", line);
      last->restart();
    }
  };
  const Stopwatch clock;
  const RoutingAnalysis r = analyze_routing(m, o);
  spdlog::info("analysed {} tokens of {} documents in {:.1f} s", r.tokens, r.documents,
               clock.seconds());
  for (const auto& l : r.layer)
    spdlog::info("  L{}  MI {}  vocabulary specialisation {}  repeat {:.3f} (chance {:.3f})",
                 l.layer, l.router.tokens > 0 ? fmt::format("{:.3f}", l.router.mi) : "-",
                 l.vocab_specialisation ? fmt::format("{:.3f}", *l.vocab_specialisation)
                                        : std::string("too few tokens"),
                 l.repeat_rate, l.repeat_chance);
  if (!r.saturation_note.empty()) spdlog::info("{}", r.saturation_note);
  const std::string out = !a.analyze_out.empty() ? a.analyze_out
                          : !m.run_dir.empty()   ? m.run_dir + "/analysis.html"
                                                 : "analysis.html";
  write_file_atomic(out, render_analysis_page(r));
  spdlog::info("wrote {}", out);
  if (a.json) std::cout << nlohmann::json(r).dump() << std::endl;
  return 0;
}

int generate_command(const Args& a, minimind::EvalModel& m) {
  using namespace minimind;
  if (!m.tokenizer)
    throw TokenizerError("generation needs a tokenizer: pass --tokenizer FILE.model");
  const Tokenizer& tok = *m.tokenizer;
  std::vector<int64_t> prompt{kBosId};
  for (int32_t id : tok.encode(a.prompt)) prompt.push_back(id);
  std::cout << a.prompt << std::flush;
  std::vector<int32_t> generated;
  // Stream the text as it comes, decoding only a window of recent tokens (decoding all of
  // them per token was quadratic): the window starts where the text printed before last
  // ended; what the window decodes to beyond its own start's text is new. Both decodes
  // start at the same token, so SentencePiece's dropped leading space cancels; an
  // unfinished UTF-8 character (decoded as U+FFFD until its last byte) waits.
  size_t window = 0, printed_upto = 0, printed = 0;  // tokens; bytes printed in all
  const Stopwatch clock;
  auto on_token = [&](int64_t id) {
    generated.push_back(static_cast<int32_t>(id));
    const std::vector<int32_t> head(generated.begin() + window, generated.begin() + printed_upto),
        all(generated.begin() + window, generated.end());
    const std::string before = tok.decode(head), text = tok.decode(all);
    if (text.size() <= before.size()) return;
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    std::cout << text.substr(before.size()) << std::flush;
    printed += text.size() - before.size();
    window = printed_upto;
    printed_upto = generated.size();
  };
  std::vector<int64_t> out = generate(m.model, prompt, a.gen, on_token);
  const double secs = clock.seconds();
  const std::string text = tok.decode(generated);
  if (text.size() > printed) std::cout << text.substr(printed);
  std::cout << std::endl;
  spdlog::info("{} tokens in {:.2f} s ({:.1f} tokens/s, KV cache {})", out.size(), secs,
               out.size() / std::max(secs, 1e-9), a.gen.use_cache ? "on" : "off");
  const int64_t max_positions = m.config.model.max_position_embeddings;
  if (static_cast<int64_t>(out.size()) < a.gen.max_new_tokens &&
      static_cast<int64_t>(prompt.size() + out.size()) >= max_positions)
    spdlog::warn("stopped at model.max_position_embeddings = {} positions (prompt {} + {} new)",
                 max_positions, prompt.size(), out.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  minimind::use_kernels_fitting_the_cpu(argv);  // may re-execute: before anything else
  minimind::tune_malloc();                      // before the first large tensor
  CLI::App app{
      "minimind-eval: evaluate a checkpoint, generate text, or inspect a run's expert load"};
  Args a;
  bool no_cache = false;
  app.add_option(
      "--checkpoint", a.checkpoint,
      "checkpoint directory (runs/X/checkpoints/step_N), run directory, or MiniMind .pth");
  app.add_option("--config", a.config, "YAML config (required for a bare .pth)");
  app.add_option("--tokenizer", a.tokenizer,
                 "sentencepiece .model (default: the run's tokenizer.model)");
  app.add_option("--data", a.data_list,
                 "JSONL corpus to evaluate (default: the run's validation split); with "
                 "--analyze, repeatable as NAME=FILE.jsonl, one domain each");
  app.add_option("--max-docs", a.max_docs, "evaluate at most N documents")
      ->check(minimind_app::integer_in(1, std::numeric_limits<int64_t>::max()));
  app.add_option("--batch-size", a.batch_size, "rows per forward (default: train.batch_size)")
      ->check(minimind_app::integer_in(1, int64_t{1} << 20));
  app.add_option("--threads", a.threads, "intra-op threads (default: one per core)")
      ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
  app.add_flag("--json", a.json, "print one JSON object on stdout (human output goes to stderr)");
  app.add_option("--prompt", a.prompt, "generate a continuation of TEXT");
  app.add_option("--max-new-tokens", a.gen.max_new_tokens, "tokens to generate (default 256)")
      ->check(minimind_app::integer_in(0, int64_t{1} << 30));
  // Below 0.01, or a penalty outside [0.01, 100], logits of ordinary size overflow float.
  app.add_option("--temperature", a.gen.temperature, "sampling temperature (default 0.85)")
      ->check(minimind_app::number_in(0.01, 100));
  app.add_option("--top-k", a.gen.top_k, "keep the k most likely tokens, 0 = off (default 50)")
      ->check(minimind_app::integer_in(0, int64_t{1} << 30));
  app.add_option("--top-p", a.gen.top_p, "nucleus sampling threshold, 1 = off (default 0.85)")
      ->check(minimind_app::number_in(0, 1));
  app.add_option("--repetition-penalty", a.gen.repetition_penalty,
                 "MiniMind's penalty, 1 = off (default 1.0)")
      ->check(minimind_app::number_in(0.01, 100));
  app.add_option("--seed", a.gen.seed, "sampling seed (default 42)")
      ->check(minimind_app::integer_in(0, std::numeric_limits<int64_t>::max()));
  app.add_flag("--greedy", a.gen.greedy, "always take the most likely token");
  bool ignore_eos = false;
  app.add_flag("--ignore-eos", ignore_eos,
               "keep generating past the end-of-text token (for timing a fixed length)");
  app.add_flag("--no-cache", no_cache,
               "recompute the whole sequence for every token (slow; for checks)");
  app.add_option("--inspect", a.inspect,
                 "show a run's expert-load history in the terminal (RUN_DIR)");
  app.add_option("--report", a.report, "write RUN_DIR/report.html");
  app.add_option("--compare", a.compare,
                 "compare two or more runs (RUN_DIR RUN_DIR ...): writes compare.html")
      ->expected(2, 1 << 20);
  app.add_option("--compare-out", a.compare_out, "where --compare writes (default compare.html)");
  app.add_option("--analyze", a.analyze,
                 "routing analysis of a MoE checkpoint or run (PATH as --checkpoint): what "
                 "each expert learned, on --data corpora or the validation split");
  app.add_option("--analyze-out", a.analyze_out,
                 "where --analyze writes its page (default RUN_DIR/analysis.html)");
  // --inspect, --report and --compare read runs' logs; evaluation options would be ignored
  // with them.
  for (const char* reader : {"--inspect", "--report", "--compare"})
    for (const char* other :
         {"--checkpoint", "--config", "--tokenizer", "--data", "--prompt", "--analyze"})
      app.get_option(reader)->excludes(app.get_option(other));
  for (const char* other : {"--checkpoint", "--prompt"})
    app.get_option("--analyze")->excludes(app.get_option(other));
  if (const int status = minimind_app::parse_command_line(app, argc, argv); status >= 0)
    return status;
  a.gen.use_cache = !no_cache;
  if (ignore_eos) a.gen.eos_id = -1;
  if (a.analyze.empty() && a.data_list.size() > 1) {
    std::cerr << "--data: give one corpus to evaluate (several, NAME=FILE, only with --analyze)\n";
    return 1;
  }
  if (!a.data_list.empty() && a.analyze.empty()) a.data = a.data_list[0];

  // Human-readable output goes to stderr so that stdout carries only the result.
  spdlog::set_default_logger(spdlog::stderr_color_mt("minimind-eval"));
  return minimind::run_main([&] {
    if (!a.compare.empty()) {
      minimind::write_compare(a.compare, a.compare_out);
      spdlog::info("wrote {} ({} runs)", a.compare_out, a.compare.size());
      return 0;
    }
    if (!a.inspect.empty() || !a.report.empty()) {
      if (!a.inspect.empty())
        std::cout << minimind::inspect_text(minimind::read_run_logs(a.inspect));
      if (!a.report.empty()) spdlog::info("wrote {}", minimind::write_report(a.report));
      return 0;
    }
    if (!a.analyze.empty()) {
      const int threads = minimind::use_threads(a.threads);
      minimind::EvalModel m =
          minimind::load_eval_model(a.analyze, a.config, a.tokenizer, !a.data_list.empty());
      spdlog::info("loaded {}", m.weights);
      return analyze_command(a, m, threads);
    }
    if (a.checkpoint.empty()) {
      spdlog::error("give --checkpoint PATH (or --inspect / --report RUN_DIR); see --help");
      return 1;
    }
    const int threads = minimind::use_threads(a.threads);
    const bool generating = !a.prompt.empty();
    minimind::EvalModel m = minimind::load_eval_model(a.checkpoint, a.config, a.tokenizer,
                                                      generating || !a.data.empty());
    spdlog::info("loaded {}", m.weights);
    if (!generating || !a.data.empty()) evaluate_command(a, m, threads);
    if (generating) generate_command(a, m);
    return 0;
  });
}
