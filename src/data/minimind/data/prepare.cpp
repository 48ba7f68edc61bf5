#include "minimind/data/prepare.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include "minimind/data/jsonl.h"
#include "minimind/data/sft.h"
#include "minimind/data/tokenizer.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/input_file.h"
#include "minimind/util/mix64.h"
#include "minimind/util/stop_flag.h"
#include "minimind/util/stopwatch.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

// The way out of a failed tokenizer training, from sentencepiece's message: a vocabulary
// larger than the corpus can fill ("Please set it to a value <= N") or smaller than the
// byte pieces, specials and characters it must hold.
std::string vocab_size_hint(const std::string& message) {
  const std::string bound = "value <= ";
  if (const size_t at = message.find(bound); at != std::string::npos) {
    size_t end = at + bound.size();
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    const std::string largest = message.substr(at + bound.size(), end - at - bound.size());
    return "the corpus is too small for that many pieces: lower model.vocab_size (at most " +
           largest + " for this corpus) or give more text";
  }
  if (message.find("too high") != std::string::npos)
    return "the corpus is too small for that many pieces: lower model.vocab_size or give more "
           "text";
  if (message.find("smaller than required") != std::string::npos)
    return "a byte-fallback BPE needs at least 256 byte pieces, 3 specials and the corpus's "
           "distinct characters: raise model.vocab_size";
  return "check model.vocab_size against the corpus";
}

// Bump when the tokenizer options or the token-file recipe change: old caches then miss.
constexpr int kTokenizerRecipe = 1;

// The most text the tokenizer is trained on (see prepare_data).
constexpr uint64_t kTokenizerSampleBytes = 32u << 20;

std::string read_file(const std::string& path, const char* what) {
  return open_input<DataError>(path, what).read_all();
}

// A 128-bit content key over several parts, each length-prefixed: byte strings, or files
// read in 1 MiB pieces (a gigabyte corpus is hashed without being held in memory; the key
// is the same as hashing the file's bytes as one string).
class KeyBuilder {
 public:
  KeyBuilder() : st_(XXH3_createState()) { XXH3_128bits_reset(st_); }
  ~KeyBuilder() { XXH3_freeState(st_); }
  KeyBuilder(const KeyBuilder&) = delete;
  KeyBuilder& operator=(const KeyBuilder&) = delete;
  KeyBuilder& add(std::string_view part) {
    prefix(part.size());
    XXH3_128bits_update(st_, part.data(), part.size());
    return *this;
  }
  KeyBuilder& add_file(const std::string& path, const char* what) {
    InputFile in = open_input<DataError>(path, what);
    prefix(in.size());
    std::vector<char> buf(1 << 20);
    while (const size_t n = in.read(buf.data(), buf.size()))
      XXH3_128bits_update(st_, buf.data(), n);
    return *this;
  }
  SourceKey key() const {
    const XXH128_hash_t h = XXH3_128bits_digest(st_);
    return {h.low64, h.high64};
  }

 private:
  void prefix(uint64_t n) { XXH3_128bits_update(st_, &n, sizeof(n)); }
  XXH3_state_t* st_;
};

std::string hex(const SourceKey& k) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(k[1]),
                static_cast<unsigned long long>(k[0]));
  return buf;
}

// A byte-based progress bar with rate and ETA, logged every few seconds.
class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, spdlog::logger& log)
      : label_(std::move(label)), total_(std::max<uint64_t>(1, total_bytes)), log_(log) {}
  void update(uint64_t done) {
    if (since_last_.seconds() < 3.0 || done >= total_) return;
    since_last_.restart();
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    const double rate = done / std::max(1e-9, since_start_.seconds());  // bytes/s
    const int filled = static_cast<int>(frac * 30);
    log_.info("{} [{}{}] {:3.0f}% {:.0f}/{:.0f} MB, {:.1f} MB/s, ETA {:.0f} s", label_,
              std::string(static_cast<size_t>(filled), '#'),
              std::string(static_cast<size_t>(30 - filled), '.'), 100 * frac, done / 1e6,
              total_ / 1e6, rate / 1e6, (total_ - done) / std::max(rate, 1e-9));
  }
  double elapsed() const { return since_start_.seconds(); }

 private:
  std::string label_;
  uint64_t total_;
  spdlog::logger& log_;
  Stopwatch since_start_, since_last_;
};

// Ctrl-C during preparation ends it at the next record: the writers' destructors remove
// their temporaries, so the cache holds only whole files (a 1 GB corpus takes minutes).
void check_stop(const StopFlag* stop) {
  if (stop && stop->signal() != 0)
    throw Interrupted(stop->signal(),
                      "interrupted while preparing the data (signal " +
                          std::to_string(stop->signal()) +
                          "): nothing half-made was cached; the next run prepares it again");
}

// What one pass over the corpus learns: the usable records, their text bytes.
struct CorpusCount {
  CorpusStats stats;
  uint64_t text_bytes = 0;
};

CorpusCount count_records(const std::string& path, bool strict, spdlog::logger& log,
                          const StopFlag* stop) {
  CorpusCount c;
  c.stats = read_corpus(
      path, {strict, 20},
      [&](std::string_view text, int64_t) {
        check_stop(stop);
        c.text_bytes += text.size();
      },
      log);
  log.info("{}", c.stats.summary(path));
  return c;
}

CorpusCount count_conversations(const std::string& path, bool strict, spdlog::logger& log,
                                const StopFlag* stop) {
  CorpusCount c;
  c.stats = read_conversations(
      path, {strict, 20},
      [&](Conversation&& conv, int64_t) {
        check_stop(stop);
        for (const auto& m : conv.messages) c.text_bytes += m.content.size();
      },
      log);
  log.info("{}", c.stats.summary(path));
  return c;
}

// Later passes over a corpus already counted: its bad lines were reported by the first.
spdlog::logger& quiet_logger() {
  static spdlog::logger quiet("quiet");
  return quiet;
}

// Chat data into token files (data.mode: sft): conversation i goes to out(i) (nullptr:
// skipped) as two documents, its rendering and the same without empty think blocks, and
// its may-take-a-system-prompt flag to index(i).
void tokenise_conversations(const Tokenizer& tok, const std::string& path,
                            const std::function<TokenFileWriter*(int64_t)>& out,
                            const std::function<SftIndex*(int64_t)>& index, spdlog::logger& log,
                            const StopFlag* stop) {
  const SftEncoder enc(tok);
  const Stopwatch clock;
  int64_t i = 0, conversations = 0;
  uint64_t tokens = 0;
  read_conversations(
      path, {false, 0},
      [&](Conversation&& c, int64_t) {
        check_stop(stop);
        const int64_t k = i++;
        if (TokenFileWriter* dest = out(k)) {
          tokens += static_cast<uint64_t>(enc.add_to(c, *dest, *index(k)));
          ++conversations;
        }
      },
      quiet_logger());
  log.info("tokenised {}: {} conversations, {} tokens ({} template) in {:.1f} s", path,
           conversations, tokens, enc.chat_template().name(), clock.seconds());
}

// Tokenises a corpus (one streaming pass) into token files: record i goes to `out[i]` ==
// nullptr ? skipped : that writer. Records are read in batches of ~8 MB; a batch is
// tokenised by `threads` workers while the next one is read, and written in order.
void tokenise_corpus(const Tokenizer& tok, const std::string& path, uint64_t text_bytes,
                     const std::function<TokenFileWriter*(int64_t)>& out, int threads,
                     spdlog::logger& log, const StopFlag* stop) {
  using Docs = std::vector<std::vector<int32_t>>;
  struct Batch {
    std::vector<std::string> texts;
    std::vector<TokenFileWriter*> dest;
    std::vector<Docs> chunks;  // chunk c: the documents of texts[64c, 64c + 64)
    std::vector<std::future<void>> workers;
  };
  const size_t n_threads = static_cast<size_t>(std::max(1, threads));
  Progress progress("tokenising", text_bytes, log);
  uint64_t done_bytes = 0, tokens = 0;
  std::optional<Batch> pending;  // being tokenised
  auto drain = [&] {
    if (!pending) return;
    for (auto& w : pending->workers) w.get();
    size_t i = 0;
    for (const auto& chunk : pending->chunks)
      for (const auto& doc : chunk) {
        done_bytes += pending->texts[i].size();
        tokens += doc.size();
        pending->dest[i++]->add_document(doc);
      }
    pending.reset();
    progress.update(done_bytes);
  };
  Batch batch;
  uint64_t batch_bytes = 0;
  auto launch = [&] {
    drain();
    Batch& b = pending.emplace(std::move(batch));
    batch = Batch();
    batch_bytes = 0;
    // Workers take chunks of 64 records in turn (records differ in length, so fixed halves
    // would leave one worker idle at the end of each batch); chunks keep file order.
    const size_t n = b.texts.size();
    b.chunks.resize((n + 63) / 64);
    auto next = std::make_shared<std::atomic<size_t>>(0);
    for (size_t t = 0; t < n_threads; ++t)
      b.workers.push_back(std::async(std::launch::async, [&tok, &b, next, n] {
        for (size_t c; (c = (*next)++) < b.chunks.size();)
          for (size_t i = 64 * c; i < std::min(n, 64 * c + 64); ++i)
            b.chunks[c].push_back(tok.encode_document(b.texts[i]));
      }));
  };
  int64_t index = 0;
  read_corpus(
      path, {false, 0},
      [&](std::string_view text, int64_t) {
        check_stop(stop);  // unwinding waits for the running workers (their futures)
        TokenFileWriter* dest = out(index++);
        if (!dest) return;
        batch.texts.emplace_back(text);
        batch.dest.push_back(dest);
        batch_bytes += text.size();
        if (batch_bytes >= (8u << 20)) launch();
      },
      quiet_logger());
  if (!batch.texts.empty()) launch();
  drain();
  const double secs = progress.elapsed();
  log.info("tokenised {}: {:.1f} MB of text, {} tokens in {:.1f} s ({:.2f} MB/s, {:.0f} tokens/s)",
           path, done_bytes / 1e6, tokens, secs, done_bytes / 1e6 / secs, tokens / secs);
}

bool usable(const std::string& path, const SourceKey& key, spdlog::logger& log) {
  if (!fs::exists(path)) return false;
  try {
    return TokenFile::open(path).source_key() == key;
  } catch (const DataError& e) {
    log.warn("{}; preparing it again", e.what());
    return false;
  }
}

}  // namespace

void check_data_paths(const Config& cfg) {
  auto check = [&](const char* key, const std::string& path) {
    if (path.empty()) return;
    const auto origin = cfg.origin.find(key);
    const std::string where = origin != cfg.origin.end() ? origin->second : "default";
    // Opened as every reader opens it (never waiting on a FIFO), then closed again.
    const std::string problem = InputFile().open(path);
    if (problem == "does not exist")
      throw DataError(std::string(key) + " (" + where + "): '" + path + "' does not exist",
                      "check the path; a relative path is read from the working directory");
    if (!problem.empty())
      throw DataError(std::string(key) + " (" + where + "): '" + path + "' " + problem +
                          (problem.rfind("is ", 0) == 0 ? ", not a regular file" : ""),
                      "give the path of a regular file");
  };
  check("data.train", cfg.data.train);
  check("data.val", cfg.data.val);
  check("data.tokenizer", cfg.data.tokenizer);
}

std::vector<bool> validation_mask(int64_t n, double fraction) {
  std::vector<bool> mask(static_cast<size_t>(n), false);
  // At least one record stays for training: a one-record corpus gets no validation split.
  const int64_t k = std::min<int64_t>(n - 1, static_cast<int64_t>(std::ceil(fraction * n)));
  if (k <= 0) return mask;
  // The k records with the smallest hash of their index: spread out, and fixed for a given n.
  std::vector<std::pair<uint64_t, int64_t>> order;
  for (int64_t i = 0; i < n; ++i) order.emplace_back(mix64(static_cast<uint64_t>(i)), i);
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end());
  for (int64_t j = 0; j < k; ++j) mask[static_cast<size_t>(order[j].second)] = true;
  return mask;
}

PreparedData prepare_data(const DataConfig& data, int64_t vocab_size, int threads,
                          spdlog::logger& log, const StopFlag* stop) {
  const Stopwatch total;
  PreparedData out;
  // The corpus is streamed: hashed once for the cache keys, then read record by record
  // (a count, a tokenizer sample, the tokenisation), never held in memory whole.
  open_input<DataError>(data.train, "corpus", "a JSONL file");
  if (!data.val.empty()) open_input<DataError>(data.val, "validation corpus", "a JSONL file");
  const std::string split = data.val.empty() ? "fraction " + std::to_string(data.val_fraction)
                                             : "file " + std::to_string(fs::file_size(data.val));
  fs::create_directories(fs::path(data.cache_dir) / "tokenizers");
  std::optional<CorpusCount> train_count;  // made only when something has to be made
  const bool chat = data.mode == "sft";
  auto count = [&](const std::string& path, bool strict) {
    return chat ? count_conversations(path, strict, log, stop)
                : count_records(path, strict, log, stop);
  };
  auto counted = [&]() -> CorpusCount& {
    if (!train_count) train_count = count(data.train, data.strict);
    return *train_count;
  };
  auto held_out_mask = [&] {
    const auto n = static_cast<int64_t>(counted().stats.records);
    return data.val.empty() ? validation_mask(n, data.val_fraction)
                            : std::vector<bool>(static_cast<size_t>(n), false);
  };

  // 1. The tokenizer: given, or trained on (a sample of) the training split and cached.
  std::string model_bytes;
  if (chat && data.tokenizer.empty())
    throw DataError(
        "data.mode: sft needs a tokenizer with a chat template, and data.tokenizer is empty",
        "start from a trained run (train.init_from: RUN uses its tokenizer), or set "
        "data.tokenizer to a run's tokenizer file or a tokenizer.json with its "
        "tokenizer_config.json beside it");
  if (!data.tokenizer.empty()) {
    out.tokenizer_path = data.tokenizer;
    model_bytes = read_file(data.tokenizer, "tokenizer model");
    out.tokenizer_cached = true;
  } else {
    KeyBuilder kb;
    kb.add("tokenizer").add(std::to_string(kTokenizerRecipe)).add(std::to_string(vocab_size));
    kb.add(split).add_file(data.train, "corpus");
    const SourceKey key = kb.key();
    out.tokenizer_path = (fs::path(data.cache_dir) / "tokenizers" / (hex(key) + ".model")).string();
    if (fs::exists(out.tokenizer_path)) {
      model_bytes = read_file(out.tokenizer_path, "tokenizer model");
      out.tokenizer_cached = true;
    } else {
      const std::vector<bool> held_out = held_out_mask();
      // BPE training holds its input and per-word statistics in memory (several times the
      // text): it reads at most kTokenizerSampleBytes, records drawn by a hash of their
      // index (the same sample on every machine). All of a corpus below the budget.
      const double keep = std::min(1.0, static_cast<double>(kTokenizerSampleBytes) /
                                            std::max<uint64_t>(1, counted().text_bytes));
      std::vector<std::string> sample;
      uint64_t sample_bytes = 0;
      int64_t index = 0;
      read_corpus(
          data.train, {false, 0},
          [&](std::string_view text, int64_t) {
            check_stop(stop);
            const auto i = static_cast<size_t>(index++);
            if (held_out[i]) return;
            if (keep < 1.0 && static_cast<double>(mix64(i ^ 0x746f6b656e697aULL)) >=
                                  keep * 18446744073709551616.0)
              return;
            sample.emplace_back(text);
            sample_bytes += text.size();
          },
          quiet_logger());
      const std::vector<std::string_view> texts(sample.begin(), sample.end());
      log.info(
          "training a {}-piece BPE tokenizer on {} records ({:.1f} MB{})...", vocab_size,
          texts.size(), sample_bytes / 1e6,
          keep < 1.0 ? fmt::format(", a {:.1f}% sample of the training split", 100 * keep) : "");
      const Stopwatch training;
      try {
        model_bytes = Tokenizer::train(texts, static_cast<int32_t>(vocab_size));
      } catch (const TokenizerError& e) {
        // sentencepiece's words; the setting that decides it is ours.
        throw TokenizerError(
            "cannot train a tokenizer of model.vocab_size = " + std::to_string(vocab_size) +
                " pieces on " + data.train + ": " + e.message(),
            vocab_size_hint(e.message()));
      }
      write_file_atomic(out.tokenizer_path, model_bytes);
      log.info("tokenizer trained in {:.2f} s -> {}", training.seconds(), out.tokenizer_path);
    }
  }
  // A given file is read as a file: a tokenizer.json's special tokens may be named beside it.
  const Tokenizer tok = data.tokenizer.empty()
                            ? Tokenizer::from_bytes(model_bytes, out.tokenizer_path)
                            : Tokenizer::from_file(data.tokenizer);
  tok.check_vocab_size(vocab_size);

  // 2. Token files, keyed on corpus, split and tokenizer content.
  KeyBuilder kb;
  kb.add("tokens").add(std::to_string(kTokenFileVersion)).add(std::to_string(kTokenizerRecipe));
  // Since 2026-12-07 a sentencepiece model's special tokens typed in a text are those tokens
  // (Tokenizer::encode): token files made before may hold their characters.
  kb.add("special tokens in text");
  // Chat data: each conversation's two renderings by the tokenizer's template.
  if (chat) kb.add(std::string("sft ") + tok.chat_template().name());
  kb.add(split).add_file(data.train, "corpus");
  if (data.val.empty())
    kb.add("");
  else
    kb.add_file(data.val, "validation corpus");
  kb.add(model_bytes);
  // Which tokens open and close a document and pad a row (MiniMind's ids add nothing, so
  // caches made before this was keyed stay valid).
  if (const SpecialIds& sp = tok.specials(); sp != SpecialIds{})
    kb.add(std::to_string(sp.pad) + " " + std::to_string(sp.bos) + " " + std::to_string(sp.eos));
  const SourceKey key = kb.key();
  const fs::path dir = fs::path(data.cache_dir) / "tokens" / hex(key);
  out.train_path = (dir / "train.tok").string();
  const bool has_val = !data.val.empty() || data.val_fraction > 0;
  out.val_path = has_val ? (dir / "val.tok").string() : "";
  auto usable_file = [&](const std::string& path) {
    return usable(path, key, log) && (!chat || fs::exists(path + ".sft"));
  };
  out.tokens_cached = usable_file(out.train_path) && (!has_val || usable_file(out.val_path));
  // data.strict refuses a corpus with bad lines even when its token files are cached
  // (they were made by a run that skipped the lines).
  if (data.strict && out.tokens_cached) {
    counted();
    if (!data.val.empty()) count(data.val, true);
  }
  if (!out.tokens_cached) {
    fs::create_directories(dir);
    const std::vector<bool> held_out = held_out_mask();
    const auto vocab = static_cast<uint32_t>(tok.vocab_size());
    const auto pad = static_cast<uint32_t>(tok.specials().pad);
    TokenFileWriter train_writer(out.train_path, vocab, key, pad);
    std::optional<TokenFileWriter> val_writer;
    if (has_val) val_writer.emplace(out.val_path, vocab, key, pad);
    auto split_of = [&](int64_t i) {
      return held_out[static_cast<size_t>(i)] ? &*val_writer : &train_writer;
    };
    if (chat) {
      SftIndex train_index = SftEncoder(tok).index_base(), val_index = train_index;
      tokenise_conversations(
          tok, data.train, split_of,
          [&](int64_t i) { return held_out[static_cast<size_t>(i)] ? &val_index : &train_index; },
          log, stop);
      if (!data.val.empty()) {
        count(data.val, data.strict);
        tokenise_conversations(
            tok, data.val, [&](int64_t) { return &*val_writer; },
            [&](int64_t) { return &val_index; }, log, stop);
      }
      // Each index before its token file: a token file found is one with its index.
      train_index.write(out.train_path);
      if (val_writer) val_index.write(out.val_path);
    } else {
      tokenise_corpus(tok, data.train, counted().text_bytes, split_of, threads, log, stop);
      if (!data.val.empty()) {
        const CorpusCount val_count = count(data.val, data.strict);
        tokenise_corpus(
            tok, data.val, val_count.text_bytes, [&](int64_t) { return &*val_writer; }, threads,
            log, stop);
      }
    }
    train_writer.finish();
    if (val_writer) val_writer->finish();
  }
  TokenFile train = TokenFile::open(out.train_path);
  out.train_tokens = train.num_tokens();
  out.train_docs = train.num_docs();
  if (has_val) {
    TokenFile val = TokenFile::open(out.val_path);
    out.val_tokens = val.num_tokens();
    out.val_docs = val.num_docs();
  }
  log.info("data ready in {:.2f} s{}: train {} tokens ({} docs), val {} tokens ({} docs)",
           total.seconds(), out.tokens_cached && out.tokenizer_cached ? " (cached)" : "",
           out.train_tokens, out.train_docs, out.val_tokens, out.val_docs);
  return out;
}

std::string file_content_key(const std::string& path, const char* what) {
  KeyBuilder kb;
  return hex(kb.add_file(path, what).key());
}

}  // namespace minimind
