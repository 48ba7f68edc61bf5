// minimind-eval: loss/perplexity and expert load of a checkpoint on any corpus, text
// generation, and inspection of a run's expert-load logs (terminal and report.html).
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "command_line.h"
#include "minimind/analysis/charts.h"
#include "minimind/analysis/compare.h"
#include "minimind/analysis/inspect.h"
#include "minimind/analysis/report.h"
#include "minimind/analysis/routing_page.h"
#include "minimind/compute_plan.h"
#include "minimind/data/jsonl.h"
#include "minimind/data/prepare.h"
#include "minimind/data/sft.h"
#include "minimind/data/tokenizer.h"
#include "minimind/error.h"
#include "minimind/eval/analyze.h"
#include "minimind/eval/chat_session.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/eval/evaluate.h"
#include "minimind/eval/generate.h"
#include "minimind/eval/text_stream.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/run/run_log.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/input_file.h"
#include "minimind/util/matmul.h"
#include "minimind/util/output_path.h"
#include "minimind/util/stopwatch.h"

namespace {

// A page's output: a file of the user's under its name is refused, never replaced.
void check_page_output(const std::string& path, const std::string& what) {
  minimind::check_own_output_file(path, what, "a page minimind-eval writes",
                                  minimind::is_tool_page);
}

// The options of every subcommand; each subcommand registers the ones it reads.
struct Args {
  std::string path;  // checkpoint or run directory (loss, generate, analyze) or run (inspect)
  std::string config, tokenizer, data, prompt, out;
  std::vector<std::string> data_list;  // analyze: repeatable, NAME=FILE
  std::vector<std::string> runs;       // compare
  int64_t max_docs = -1, batch_size = 0, threads = -1;
  std::string precision;          // empty: the run's run.precision
  std::vector<std::string> sets;  // run.KEY=VALUE on the run's config
  bool json = false, truncate = false, follow = false;
  std::string text;                      // tokenize --text
  bool decode = false, special = false;  // tokenize
  bool chat = false;                     // tokenize --chat
  int64_t max_seq_len = 0;               // tokenize --chat: rows of this many ids
  // tokenize --chat: end with the next answer's opening (chat's prompt), open think block
  bool generation_prompt = false, think = false;
  minimind::GenerateOptions gen;
};

// The ids of one line "3 17 256" (--decode's input); DataError naming `where` otherwise.
std::vector<int32_t> parse_ids(const std::string& line, const std::string& where) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || v < 0 || v > std::numeric_limits<int32_t>::max())
      throw minimind::DataError(where + ": '" + word + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// A token's text for a table: its decoding with control characters escaped, at most 20
// characters wide.
std::string shown_token(const minimind::Tokenizer& tok, int32_t id) {
  std::string out;
  // sentencepiece decodes its control pieces to nothing: shown by name.
  const bool control = tok.piece_type(id) == minimind::PieceType::control;
  for (const char c : control ? tok.piece(id) : tok.decode({id})) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else
      out += c;
  }
  return out;
}

// tokenize --chat: each conversation of a chat JSONL as the training rows see it (no
// augmentation): one JSON line {"ids", "labels"} with --json, else a table of its tokens and
// whether each is trained.
int tokenize_chat(const Args& a, const minimind::Tokenizer& tok) {
  using namespace minimind;
  if (a.data.empty())
    throw Error("tokenize --chat needs --data FILE.jsonl (one {\"conversations\": [...]} a line)");
  if (a.decode || a.special) throw Error("tokenize --chat takes neither --decode nor --special");
  if (a.max_seq_len < 0) throw Error("--max-seq-len must be positive (0: whole conversations)");
  if (a.think && !a.generation_prompt) throw Error("tokenize --think needs --generation-prompt");
  const SftEncoder enc(tok);
  const CorpusStats stats = read_conversations(a.data, {}, [&](Conversation&& c, int64_t line) {
    // As chat's prompt for the next answer, or as training renders it.
    const SftRow row =
        enc.row(a.generation_prompt ? enc.encode(enc.chat_template().render(c, {true, a.think}))
                                    : enc.encode(c),
                a.max_seq_len);
    if (a.json) {
      std::cout << nlohmann::json{{"ids", row.ids}, {"labels", row.labels}}.dump() << "\n";
    } else {
      int64_t trained = 0;
      for (const int64_t l : row.labels) trained += l != -100;
      std::cout << fmt::format("{}:{}: {} tokens ({} of them padding), {} trained\n", a.data, line,
                               row.ids.size(), row.ids.size() - row.length, trained);
      std::cout << fmt::format("{:>6} {:>7}  {:<20} {}\n", "pos", "id", "token", "trained");
      for (size_t i = 0; i < row.ids.size(); ++i) {
        const auto id = static_cast<int32_t>(row.ids[i]);
        std::cout << fmt::format("{:>6} {:>7}  {:<20} {}\n", i, id, shown_token(tok, id),
                                 row.labels[i] != -100 ? "yes" : "no");
      }
    }
    if (!std::cout.flush())
      throw Error("writing conversation " + a.data + ":" + std::to_string(line) +
                  " failed (output closed or disk full?)");
  });
  spdlog::info("{} ({} template)", stats.summary(a.data), enc.chat_template().name());
  return 0;
}

// minimind-eval tokenize: as llama.cpp's llama-tokenize, one record per line.
int tokenize_command(const Args& a) {
  using namespace minimind;
  std::string file = a.tokenizer;
  if (file.empty() && !a.path.empty()) {
    // A run directory, or a checkpoint inside one.
    file = run_tokenizer_file(a.path);
    if (const std::string run = run_of_checkpoint(a.path); file.empty() && !run.empty())
      file = run_tokenizer_file(run);
    if (file.empty()) throw TokenizerError("no tokenizer in '" + a.path + "' (a run directory?)");
  }
  if (file.empty()) throw TokenizerError("tokenize needs PATH (a run) or --tokenizer FILE");
  const Tokenizer tok = Tokenizer::from_file(file);
  if (a.chat) return tokenize_chat(a, tok);
  if (a.text.empty() == a.data.empty()) throw Error("tokenize needs --text TEXT or --data FILE");
  auto print_ids = [&](std::string_view text) {
    const std::vector<int32_t> ids = a.special ? tok.encode_document(text) : tok.encode(text);
    if (a.json) {
      std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  };
  auto print_text = [&](const std::string& line, const std::string& where) {
    const std::string text = tok.decode(parse_ids(line, where));
    if (a.json)
      std::cout << nlohmann::json{{"text", text}}.dump() << "\n";
    else
      std::cout << text << "\n";
  };
  if (!a.text.empty()) {
    if (a.decode) {
      print_text(a.text, "--text");
    } else {
      if (!is_valid_utf8(a.text))
        throw DataError("--text is not valid UTF-8", "pass the text in UTF-8");
      print_ids(a.text);
    }
    return 0;
  }
  if (a.decode) {
    // Line by line in bounded blocks; a line too long, memory running out or a failed write
    // stops with an error naming the line, never a silently shorter output.
    InputFile in = open_input<DataError>(a.data, "--data", "a file of token ids");
    LineReader lines(in);
    std::string line;
    bool cut = false;
    while (lines.next(line, kMaxRecordBytes, cut)) {
      const std::string where = a.data + ":" + std::to_string(lines.line_number());
      if (cut)
        throw DataError(where + ": a line over " + std::to_string(kMaxRecordBytes >> 20) +
                            " MiB of token ids; nothing of it was decoded",
                        "split it into shorter lines (each line is decoded on its own)");
      try {
        print_text(line, where);
      } catch (const std::bad_alloc&) {
        throw DataError(where + ": out of memory decoding this line");
      }
      if (!std::cout.flush())
        throw Error("writing the text of " + where + " failed (output closed or disk full?)");
    }
    return 0;
  }
  // Records as training reads them: bad lines skipped with a warning naming the line.
  read_corpus(a.data, {}, [&](std::string_view text, int64_t line) {
    print_ids(text);
    if (!std::cout.flush())
      throw Error("writing the ids of " + a.data + ":" + std::to_string(line) +
                  " failed (output closed or disk full?)");
  });
  return 0;
}

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

int evaluate_command(const Args& a, minimind::EvalModel& m, const minimind::ComputePlan& plan) {
  using namespace minimind;
  const int threads = plan.threads;
  const Config& cfg = m.config;
  std::optional<TokenFile> docs;
  std::optional<SftIndex> chat;  // chat data: the answers are scored
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("minimind-eval-" + std::to_string(::getpid())))
          .string();
  if (a.chat && a.data.empty() && cfg.data.mode != "sft")
    throw DataError("--chat: the run's validation split is text (data.mode " + cfg.data.mode +
                        "), not conversations",
                    "pass --data FILE.jsonl of conversations (one {\"conversations\": [...]} a "
                    "line)");
  if (a.chat && a.truncate)
    throw Error("--truncate is for text; a conversation is cut at data.max_seq_len");
  if (!a.data.empty()) {
    if (!m.tokenizer)
      throw TokenizerError(
          "--data needs a tokenizer: pass --tokenizer FILE (a .model or tokenizer.json)");
    if (a.chat) {
      ChatTokens t = tokenize_chat_corpus(a.data, *m.tokenizer, tmp, a.max_docs);
      docs = std::move(t.tokens);
      chat = std::move(t.index);
    } else {
      docs = tokenize_corpus(a.data, *m.tokenizer, tmp, a.max_docs);
    }
  } else {
    const std::string val = validation_split(cfg, threads, "").val_path;
    docs = TokenFile::open(val);
    if (cfg.data.mode == "sft") chat = SftIndex::read(val);
  }
  const int64_t batch = a.batch_size > 0 ? a.batch_size : cfg.train.batch_size;
  const Stopwatch clock;
  EvalResult r = chat
                     ? evaluate_chat(m.model, *docs, *chat, cfg.data.max_seq_len, batch, a.max_docs)
                     : evaluate(m.model, *docs, cfg.data.max_seq_len, batch, a.max_docs,
                                a.truncate ? LongDocuments::truncate : LongDocuments::windows);
  const double secs = clock.seconds();
  std::filesystem::remove_all(tmp);

  EvalSummary summary{r.loss,          r.ppl,     r.tokens, r.documents,     secs,
                      r.tokens / secs, m.weights, {},       r.corpus_tokens, r.corpus_documents,
                      a.truncate};
  if (chat)
    spdlog::info(
        "chat loss {:.4f} | ppl {:.2f} | {} of {} answer tokens, {} of {} conversations | "
        "{:.1f} s",
        r.loss, r.ppl, r.tokens, r.corpus_tokens, r.documents, r.corpus_documents, secs);
  else
    spdlog::info(
        "loss {:.4f} | ppl {:.2f} | {} of {} tokens predicted, {} of {} documents{} | "
        "{:.1f} s ({:.0f} tokens/s)",
        r.loss, r.ppl, r.tokens, r.corpus_tokens, r.documents, r.corpus_documents,
        r.rows > r.documents ? fmt::format(" in {} windows", r.rows) : "", secs, r.tokens / secs);
  if (chat && r.tokens < r.corpus_tokens)
    spdlog::info("  {} answer tokens left out: --max-docs stops before the end",
                 r.corpus_tokens - r.tokens);
  else if (r.tokens < r.corpus_tokens)
    spdlog::info("  {} tokens left out: {}", r.corpus_tokens - r.tokens,
                 a.truncate ? fmt::format("--truncate keeps the first {} tokens of each document",
                                          cfg.data.max_seq_len)
                            : "--max-docs stops before the end of the corpus");
  for (size_t l = 0; l < r.expert_counts.layers.size(); ++l) {
    const RoutingMetrics rm = routing_metrics(r.expert_counts.layers[l]);
    const RouterInfo ri = r.expert_counts.router_info(l);
    spdlog::info("  {}{}  counts {}", load_row(static_cast<int64_t>(l), rm),
                 ri.tokens > 0 ? "  " + router_row(ri) : "", fmt::join(rm.counts, " "));
    LoadRecord rec = LoadRecord::make(m.step, static_cast<int64_t>(l), "eval", rm);
    rec.set_router(ri);
    summary.expert_load.push_back(rec);
  }
  if (a.json) {
    nlohmann::json j = summary;
    j["plan"] = plan.to_json();  // how it was computed
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

// --analyze: the routing analysis of a MoE checkpoint on probe corpora (default: the run's
// validation split), as a page and optionally JSON.
int analyze_command(const Args& a, minimind::EvalModel& m, int threads) {
  using namespace minimind;
  const std::string out = !a.out.empty()       ? a.out
                          : !m.run_dir.empty() ? m.run_dir + "/analysis.html"
                                               : "analysis.html";
  check_page_output(out, "--out");  // before the work that fills it
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
    spdlog::warn(
        "no tokenizer: tokens are shown as #id (pass --tokenizer FILE (a .model or "
        "tokenizer.json))");
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
  write_file_atomic(out, render_analysis_page(r));
  spdlog::info("wrote {}", out);
  if (a.json) std::cout << nlohmann::json(r).dump() << std::endl;
  return 0;
}

int generate_command(const Args& a, minimind::EvalModel& m) {
  using namespace minimind;
  if (!m.tokenizer)
    throw TokenizerError(
        "generation needs a tokenizer: pass --tokenizer FILE (a .model or tokenizer.json)");
  const Tokenizer& tok = *m.tokenizer;
  std::vector<int64_t> prompt{tok.specials().bos};
  for (int32_t id : tok.encode(a.prompt)) prompt.push_back(id);
  GenerateOptions options = a.gen;
  if (options.eos_id >= 0) options.eos_id = tok.specials().eos;  // -1: --ignore-eos
  // With --json the text is not streamed: stdout carries the one JSON object.
  if (!a.json) std::cout << a.prompt << std::flush;
  TextStream stream(tok);
  std::string text;
  const Stopwatch clock;
  std::vector<int64_t> out = generate(m.model, prompt, options, [&](int64_t id) {
    const std::string piece = stream.add(static_cast<int32_t>(id));
    if (a.json)
      text += piece;
    else
      std::cout << piece << std::flush;
  });
  const double secs = clock.seconds();
  if (a.json)
    text += stream.finish();
  else
    std::cout << stream.finish() << std::endl;
  spdlog::info("{} tokens in {:.2f} s ({:.1f} tokens/s, KV cache {})", out.size(), secs,
               out.size() / std::max(secs, 1e-9), a.gen.use_cache ? "on" : "off");
  const int64_t max_positions = m.config.model.max_position_embeddings;
  const auto n_new = static_cast<int64_t>(out.size());
  std::string stop = n_new == a.gen.max_new_tokens ? "max_new_tokens" : "eos";
  if (n_new < a.gen.max_new_tokens &&
      static_cast<int64_t>(prompt.size()) + n_new >= max_positions) {
    stop = "max_position_embeddings";
    spdlog::warn("stopped at model.max_position_embeddings = {} positions (prompt {} + {} new)",
                 max_positions, prompt.size(), out.size());
  }
  if (a.json)
    std::cout << nlohmann::json{{"prompt", a.prompt},
                                {"prompt_ids", prompt},
                                {"ids", out},
                                {"text", text},
                                {"stop", stop}}
                     .dump()
              << std::endl;
  return 0;
}

// minimind-eval chat: a conversation in the terminal (/reset, /think on|off, /quit), one
// answer to --prompt (only the answer on stdout), or each conversation of --data answered
// at its last user turn (with --json, the share of answers that close their turn).
int chat_command(const Args& a, minimind::EvalModel& m, bool thinking) {
  using namespace minimind;
  if (!m.tokenizer)
    throw TokenizerError(
        "chat needs a tokenizer: pass --tokenizer FILE (a .model or tokenizer.json)");
  ChatSession chat(m.model, *m.tokenizer, a.gen);
  chat.set_thinking(thinking);
  auto print = [](const std::string& piece) { std::cout << piece << std::flush; };
  if (!a.prompt.empty()) {
    if (!is_valid_utf8(a.prompt))
      throw DataError("--prompt is not valid UTF-8", "pass it in UTF-8");
    const ChatReply r =
        chat.say(a.prompt, a.json ? std::function<void(const std::string&)>() : print);
    if (a.json)
      std::cout << nlohmann::json{{"prompt", a.prompt},
                                  {"text", r.text},
                                  {"tokens", r.tokens},
                                  {"ended", r.ended}}
                       .dump()
                << std::endl;
    else
      std::cout << std::endl;
    return 0;
  }
  if (!a.data.empty()) {
    // Each conversation up to its last user turn; what follows it (the reference answer) is
    // left out.
    nlohmann::json answers = nlohmann::json::array();
    int64_t ended = 0, n = 0;
    read_conversations(a.data, {}, [&](Conversation&& c, int64_t line) {
      if (a.max_docs >= 0 && n >= a.max_docs) return;
      size_t last = c.messages.size();
      while (last > 0 && c.messages[last - 1].role != "user") --last;
      if (last == 0) {
        spdlog::warn("{}:{}: no user turn; conversation skipped", a.data, line);
        return;
      }
      c.messages.resize(last);
      const ChatReply r = chat.answer(c);
      ++n, ended += r.ended;
      answers.push_back(
          {{"line", line}, {"text", r.text}, {"tokens", r.tokens}, {"ended", r.ended}});
      if (!a.json) std::cout << a.data << ":" << line << ": " << r.text << "\n" << std::flush;
    });
    const double share = n > 0 ? static_cast<double>(ended) / static_cast<double>(n) : 0.0;
    spdlog::info("{} of {} answers closed their turn (<|im_end|> within {} tokens): {:.1f} %",
                 ended, n, a.gen.max_new_tokens, 100 * share);
    if (a.json)
      std::cout << nlohmann::json{{"conversations", n},
                                  {"ended", ended},
                                  {"ended_share", share},
                                  {"max_new_tokens", a.gen.max_new_tokens},
                                  {"answers", answers}}
                       .dump()
                << std::endl;
    return 0;
  }
  const bool terminal = ::isatty(STDIN_FILENO) != 0;
  if (terminal)
    std::cerr << "chat with " << m.weights << " (" << chat.chat_template().name()
              << " template): /reset starts again, /think on|off, /quit ends\n";
  std::string line;
  while (true) {
    if (terminal) std::cerr << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      std::cerr << "(a new conversation)\n";
      continue;
    }
    if (line == "/think on" || line == "/think off") {
      chat.set_thinking(line == "/think on");
      std::cerr << "(thinking " << (chat.thinking() ? "on" : "off") << ")\n";
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '/') {
      std::cerr << "unknown command " << line << ": /reset, /think on|off, /quit\n";
      continue;
    }
    if (!is_valid_utf8(line)) {
      std::cerr << "not valid UTF-8; say it again\n";
      continue;
    }
    try {
      const ChatReply r = chat.say(line, print);
      std::cout << (r.ended ? "\n" : " [cut at --max-new-tokens]\n") << std::flush;
    } catch (const Error& e) {
      std::cerr << "error: " << e.message() << (e.hint().empty() ? "" : "\nhint: " + e.hint())
                << "\n";
    }
  }
  return 0;
}

}  // namespace

// Whether the trainer that owns run_dir still runs: its PID is in RUN/.lock (written by the
// lock's holder; reading it takes no lock). No file, no such process, or a process of
// another name: it has ended.
bool trainer_running(const std::string& run_dir) {
  std::ifstream in(run_dir + "/.lock");
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  // A PID the system gave to another program since: not the trainer.
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  return !(comm >> name) || name == "minimind-train";
}

// inspect --follow: the view redrawn whenever the logs change, until the trainer has gone
// (one last view after that) or Ctrl-C.
int follow_command(const std::string& run_dir) {
  const bool tty = isatty(STDOUT_FILENO);
  std::string shown;
  while (true) {
    const bool running = trainer_running(run_dir);
    const std::string text = minimind::inspect_text(minimind::read_run_logs(run_dir));
    // While running, each change redraws the view; the last pass says that the run ended
    // (redrawn on a terminal, only that line when piped and nothing changed).
    if (text != shown || !running) {
      const bool redraw = text != shown || tty;
      if (redraw) std::cout << (tty ? "\033[H\033[2J" : shown.empty() ? "" : "\n") << text;
      std::cout << (running ? "(following; Ctrl-C to stop)\n" : "(the run has ended)\n")
                << std::flush;
      shown = text;
    }
    if (!running) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return 0;
}

// The flag forms of earlier versions (--checkpoint, --inspect, ...) as the subcommand that
// replaced them, e.g. "minimind-eval inspect runs/moe"; empty when argv has none of them.
std::string old_form_as_subcommand(int argc, char** argv) {
  static const std::map<std::string, std::string> mode = {{"--checkpoint", "loss"},
                                                          {"--inspect", "inspect"},
                                                          {"--report", "report"},
                                                          {"--compare", "compare"},
                                                          {"--analyze", "analyze"}};
  std::string sub, path, rest;
  bool prompt = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (const auto it = mode.find(arg); it != mode.end()) {
      sub = it->second;
      for (; i + 1 < argc && argv[i + 1][0] != '-'; ++i) path += std::string(" ") + argv[i + 1];
    } else if (arg == "--compare-out" || arg == "--analyze-out") {
      rest += " --out";
    } else {
      prompt = prompt || arg == "--prompt";
      rest += " " + (arg.find(' ') == std::string::npos ? arg : "\"" + arg + "\"");
    }
  }
  if (sub.empty()) return "";
  if (sub == "loss" && prompt) sub = "generate";
  return "minimind-eval " + sub + path + rest;
}

int main(int argc, char** argv) {
  minimind::use_kernels_fitting_the_cpu(argv);  // may re-execute: before anything else
  if (const std::string now = old_form_as_subcommand(argc, argv); !now.empty()) {
    std::cerr << "minimind-eval: the mode flags (--checkpoint, --inspect, --report, --compare, "
                 "--analyze) became subcommands; run:\n  "
              << now << "\n";
    return 1;
  }
  // "minimind-eval PATH [options]" is "minimind-eval loss PATH [options]".
  std::vector<char*> args(argv, argv + argc);
  static const std::set<std::string> subcommands = {"loss",    "generate", "inspect",  "report",
                                                    "compare", "analyze",  "tokenize", "chat"};
  static char loss_word[] = "loss";
  if (argc > 1 && argv[1][0] != '-' && !subcommands.count(argv[1]))
    args.insert(args.begin() + 1, loss_word);

  CLI::App app{
      "minimind-eval: evaluate a checkpoint, generate text, or look at a run's expert "
      "load and routing.\n"
      "minimind-eval PATH [options] is short for minimind-eval loss PATH [options]."};
  app.require_subcommand(1);
  app.footer("Each subcommand has its own --help.");
  Args a;
  bool no_cache = false, ignore_eos = false;
  const std::string model_path =
      "checkpoint directory (RUN/checkpoints/step_N), run directory (its newest checkpoint), or "
      "MiniMind .pth (with --config)";
  // Options shared by the subcommands that load a model.
  auto model_options = [&](CLI::App* sub) {
    sub->add_option("PATH", a.path, model_path)->required();
    sub->add_option("--config", a.config, "YAML config (required for a bare .pth)");
    sub->add_option("--tokenizer", a.tokenizer,
                    "sentencepiece .model or Hugging Face tokenizer.json (default: the run's own)");
    sub->add_option("--set", a.sets,
                    "run.KEY=VALUE: how to compute, on the run's config (repeatable; "
                    "run.precision, run.matmul, run.threads, run.bf16_emulation)");
    sub->add_option("--threads", a.threads,
                    "cores to use (same as --set run.threads=N; 0 = one per core; default: the "
                    "run's run.threads)")
        ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
    sub->add_option("--precision", a.precision,
                    "fp32 or bf16 (same as --set run.precision=P; default: the run's)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
  };
  auto corpus_options = [&](CLI::App* sub) {
    sub->add_option("--max-docs", a.max_docs, "evaluate at most N documents")
        ->check(minimind_app::integer_in(1, std::numeric_limits<int64_t>::max()));
    sub->add_option("--batch-size", a.batch_size, "rows per forward (default: train.batch_size)")
        ->check(minimind_app::integer_in(1, int64_t{1} << 20));
    sub->add_flag("--json", a.json,
                  "print one JSON object on stdout (human output goes to stderr)");
  };

  CLI::App* loss = app.add_subcommand("loss", "loss, perplexity and expert load on a corpus");
  model_options(loss);
  loss->add_option("--data", a.data, "JSONL corpus (default: the run's validation split)");
  corpus_options(loss);
  loss->add_flag("--chat", a.chat,
                 "--data is chat data: score the answers only (a run trained with data.mode sft "
                 "scores its validation split so without it)");
  loss->add_flag("--truncate", a.truncate,
                 "keep only the first data.max_seq_len tokens of each document, as MiniMind's "
                 "PretrainDataset does (default: every token, in windows)");

  // Sampling, as MiniMind's generate() (generate and chat).
  auto sampling_options = [&](CLI::App* sub) {
    sub->add_option("--max-new-tokens", a.gen.max_new_tokens, "tokens to generate (default 256)")
        ->check(minimind_app::integer_in(0, int64_t{1} << 30));
    // Below 0.01, or a penalty outside [0.01, 100], logits of ordinary size overflow float.
    sub->add_option("--temperature", a.gen.temperature, "sampling temperature (default 0.85)")
        ->check(minimind_app::number_in(0.01, 100));
    sub->add_option("--top-k", a.gen.top_k, "keep the k most likely tokens, 0 = off (default 50)")
        ->check(minimind_app::integer_in(0, int64_t{1} << 30));
    sub->add_option("--top-p", a.gen.top_p, "nucleus sampling threshold, 1 = off (default 0.85)")
        ->check(minimind_app::number_in(0, 1));
    sub->add_option("--repetition-penalty", a.gen.repetition_penalty,
                    "MiniMind's penalty, 1 = off (default 1.0)")
        ->check(minimind_app::number_in(0.01, 100));
    sub->add_option("--seed", a.gen.seed, "sampling seed (default 42)")
        ->check(minimind_app::integer_in(0, std::numeric_limits<int64_t>::max()));
    sub->add_flag("--greedy", a.gen.greedy, "always take the most likely token");
  };

  CLI::App* gen = app.add_subcommand("generate", "continue a prompt, streaming the text");
  model_options(gen);
  gen->add_option("--prompt", a.prompt, "the text to continue (not empty)")->required();
  sampling_options(gen);
  gen->add_flag("--ignore-eos", ignore_eos,
                "keep generating past the end-of-text token (for timing a fixed length)");
  gen->add_flag("--no-cache", no_cache,
                "recompute the whole sequence for every token (slow; for checks)");
  gen->add_flag("--json", a.json,
                "print one JSON object instead of streaming: prompt, prompt_ids, ids, text, "
                "stop");

  CLI::App* chat = app.add_subcommand(
      "chat", "talk to a fine-tuned model: a conversation in the terminal, or one answer");
  model_options(chat);
  sampling_options(chat);
  bool think = false;
  chat->add_option("--prompt", a.prompt, "say this once and print only the answer");
  chat->add_option("--data", a.data,
                   "chat JSONL: answer each conversation's last user turn (its reference answer "
                   "left out)");
  chat->add_option("--max-docs", a.max_docs, "--data: at most N conversations")
      ->check(minimind_app::integer_in(1, std::numeric_limits<int64_t>::max()));
  chat->add_flag("--think", think, "answers start inside a think block (/think on)");
  chat->add_flag("--json", a.json,
                 "one JSON object: --prompt's answer, or --data's answers and the share that "
                 "closed their turn");

  CLI::App* inspect = app.add_subcommand("inspect", "a run's expert-load history in the terminal");
  inspect->add_option("RUN", a.path, "run directory")->required();
  inspect->add_flag("--follow", a.follow,
                    "redraw as the run's logs grow, until its trainer ends (or Ctrl-C); takes "
                    "no lock");

  CLI::App* report = app.add_subcommand("report", "write RUN/report.html");
  report->add_option("RUN", a.path, "run directory")->required();

  CLI::App* compare = app.add_subcommand("compare", "two or more runs on one page");
  compare->add_option("RUN", a.runs, "run directories")->required()->expected(2, 1 << 20);
  compare->add_option("--out", a.out, "where to write the page (default compare.html)");

  CLI::App* analyze =
      app.add_subcommand("analyze", "what a MoE's router learned and each expert specialised in");
  model_options(analyze);
  analyze->add_option("--data", a.data_list,
                      "probe corpus [NAME=]FILE.jsonl, repeatable, one domain each (default: "
                      "the run's validation split)");
  corpus_options(analyze);
  analyze->add_option("--out", a.out, "where to write the page (default RUN/analysis.html)");

  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "text to token ids, one line per record (or back with --decode)");
  tokenize->add_option("PATH", a.path, "a run or checkpoint directory: its tokenizer");
  tokenize->add_option("--tokenizer", a.tokenizer,
                       "sentencepiece .model or Hugging Face tokenizer.json (instead of PATH)");
  auto* text_option = tokenize->add_option("--text", a.text, "one text (with --decode: ids)");
  tokenize
      ->add_option("--data", a.data,
                   "JSONL corpus, a line of ids per record (with --decode: a file of such lines)")
      ->excludes(text_option);
  tokenize->add_flag("--decode", a.decode, "turn lines of ids back into text");
  tokenize->add_flag("--special", a.special, "add [bos] and [eos] around each record's ids");
  tokenize->add_flag("--json", a.json,
                     "one JSON object per record: {\"ids\": [...]} or {\"text\": ...} (--chat: "
                     "{\"ids\": [...], \"labels\": [...]})");
  tokenize->add_flag("--chat", a.chat,
                     "--data is chat data (one {\"conversations\": [...]} a line): each "
                     "conversation rendered by the tokenizer's chat template, with its labels");
  tokenize->add_option("--max-seq-len", a.max_seq_len,
                       "--chat: cut and pad each conversation to rows of N ids, as training does");
  tokenize->add_flag("--generation-prompt", a.generation_prompt,
                     "--chat: end each conversation with the opening of the next answer, the "
                     "prompt chat answers (an empty think block, as chat starts answers)");
  tokenize->add_flag("--think", a.think,
                     "--generation-prompt: open the think block instead (chat --think)");

  if (const int status =
          minimind_app::parse_command_line(app, static_cast<int>(args.size()), args.data());
      status >= 0)
    return status;
  a.gen.use_cache = !no_cache;
  if (ignore_eos) a.gen.eos_id = -1;

  // Human-readable output goes to stderr so that stdout carries only the result.
  minimind_app::use_console_logger("minimind-eval");
  return minimind::run_main([&] {
    using namespace minimind;
    if (compare->parsed()) {
      const std::string out = a.out.empty() ? "compare.html" : a.out;
      check_page_output(out, "--out");  // before the work that fills it
      write_compare(a.runs, out);
      spdlog::info("wrote {} ({} runs)", out, a.runs.size());
      return 0;
    }
    if (inspect->parsed()) {
      if (a.follow) return follow_command(a.path);
      std::cout << inspect_text(read_run_logs(a.path));
      return 0;
    }
    if (tokenize->parsed()) return tokenize_command(a);
    if (report->parsed()) {
      spdlog::info("wrote {}", write_report(a.path));
      return 0;
    }
    // As a corpus record with invalid UTF-8 is skipped, such a prompt is refused: neither
    // tokenizer kind could give its bytes back.
    if (gen->parsed() && !is_valid_utf8(a.prompt))
      throw DataError("--prompt is not valid UTF-8", "pass the prompt in UTF-8");
    if (gen->parsed() && a.prompt.empty())
      throw Error(
          "--prompt is empty: give the text to continue (to evaluate the loss, use "
          "minimind-eval loss PATH)");
    if (chat->parsed() && !a.prompt.empty() && !a.data.empty())
      throw Error("chat takes --prompt or --data, not both");
    const bool need_tokenizer =
        gen->parsed() || chat->parsed() || !a.data.empty() || !a.data_list.empty();
    EvalCompute how;
    how.run_settings = a.sets;
    if (!a.precision.empty()) how.run_settings.push_back("run.precision=" + a.precision);
    if (a.threads >= 0) how.run_settings.push_back("run.threads=" + std::to_string(a.threads));
    EvalModel m = load_eval_model(a.path, a.config, a.tokenizer, need_tokenizer, how);
    spdlog::info("loaded {}", m.weights);
    const ComputePlan& plan = m.plan;
    const ComputeScope compute(plan);
    spdlog::info("{}", plan.describe());
    const int threads = plan.threads;
    if (analyze->parsed()) return analyze_command(a, m, threads);
    if (gen->parsed()) return generate_command(a, m);
    if (chat->parsed()) return chat_command(a, m, think);
    return evaluate_command(a, m, plan);
  });
}
