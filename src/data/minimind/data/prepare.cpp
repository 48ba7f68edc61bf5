#include "minimind/data/prepare.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>

#include "minimind/data/jsonl.h"
#include "minimind/data/tokenizer.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/mix64.h"
#include "minimind/util/stopwatch.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

// Bump when the tokenizer options or the token-file recipe change: old caches then miss.
constexpr int kTokenizerRecipe = 1;

std::string read_file(const std::string& path, const char* what) {
  if (fs::is_directory(path))
    throw DataError(std::string(what) + " '" + path + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(std::string("cannot read ") + what + " '" + path + "' (missing file?)");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A 128-bit content key over several byte strings (each length-prefixed).
SourceKey content_key(std::initializer_list<std::string_view> parts) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  for (std::string_view p : parts) {
    const uint64_t n = p.size();
    XXH3_128bits_update(st, &n, sizeof(n));
    XXH3_128bits_update(st, p.data(), p.size());
  }
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return {h.low64, h.high64};
}

std::string hex(const SourceKey& k) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(k[1]),
                static_cast<unsigned long long>(k[0]));
  return buf;
}

struct Records {
  std::vector<std::string> texts;
  CorpusStats stats;
};

Records load_records(const std::string& path, bool strict, spdlog::logger& log) {
  Records r;
  r.stats = read_corpus(
      path, {strict, 20}, [&](std::string_view text, int64_t) { r.texts.emplace_back(text); }, log);
  log.info("{}", r.stats.summary(path));
  return r;
}

// Prints progress about once a second: done/total, rate and ETA.
class Progress {
 public:
  Progress(std::string label, int64_t total, spdlog::logger& log)
      : label_(std::move(label)), total_(total), log_(log) {}
  void update(int64_t done) {
    if (since_last_.seconds() < 1.0 || done >= total_) return;
    since_last_.restart();
    const double rate = done / std::max(1e-9, since_start_.seconds());
    log_.info("{}: {}/{} records ({:.0f} records/s, ETA {:.0f} s)", label_, done, total_, rate,
              (total_ - done) / std::max(rate, 1e-9));
  }
  double elapsed() const { return since_start_.seconds(); }

 private:
  std::string label_;
  int64_t total_;
  spdlog::logger& log_;
  Stopwatch since_start_, since_last_;
};

// Tokenises texts (in parallel, order kept) into a token file; returns its token count.
uint64_t write_tokens(const Tokenizer& tok, const std::vector<const std::string*>& texts,
                      const std::string& path, SourceKey key, int threads, const std::string& label,
                      spdlog::logger& log) {
  TokenFileWriter writer(path, static_cast<uint32_t>(tok.vocab_size()), key);
  Progress progress("tokenising " + label, static_cast<int64_t>(texts.size()), log);
  uint64_t bytes = 0;
  const size_t chunk = 256;
  const size_t n_threads = static_cast<size_t>(std::max(1, threads));
  for (size_t begin = 0; begin < texts.size(); begin += chunk * n_threads) {
    std::vector<std::future<std::vector<std::vector<int32_t>>>> parts;
    for (size_t t = 0; t < n_threads; ++t) {
      const size_t lo = std::min(texts.size(), begin + t * chunk);
      const size_t hi = std::min(texts.size(), lo + chunk);
      parts.push_back(std::async(std::launch::async, [&, lo, hi] {
        std::vector<std::vector<int32_t>> docs;
        for (size_t i = lo; i < hi; ++i) docs.push_back(tok.encode_document(*texts[i]));
        return docs;
      }));
    }
    for (auto& p : parts)
      for (const auto& doc : p.get()) writer.add_document(doc);
    const size_t done = std::min(texts.size(), begin + chunk * n_threads);
    for (size_t i = begin; i < done; ++i) bytes += texts[i]->size();
    progress.update(static_cast<int64_t>(done));
  }
  writer.finish();
  const double secs = progress.elapsed();
  log.info("tokenised {}: {} records, {} tokens in {:.2f} s ({:.2f} MB/s, {:.0f} tokens/s)", label,
           texts.size(), writer.num_tokens(), secs, bytes / 1e6 / secs, writer.num_tokens() / secs);
  return writer.num_tokens();
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
    if (!fs::exists(path))
      throw DataError(std::string(key) + " (" + where + "): '" + path + "' does not exist",
                      "check the path; a relative path is read from the working directory");
    if (!fs::is_regular_file(path))
      throw DataError(std::string(key) + " (" + where + "): '" + path + "' is not a file");
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
                          spdlog::logger& log) {
  const Stopwatch total;
  PreparedData out;
  const std::string corpus = read_file(data.train, "corpus");
  const std::string val_corpus = data.val.empty() ? "" : read_file(data.val, "validation corpus");
  const std::string split = data.val.empty() ? "fraction " + std::to_string(data.val_fraction)
                                             : "file " + std::to_string(val_corpus.size());
  fs::create_directories(fs::path(data.cache_dir) / "tokenizers");

  // Records are parsed only when something has to be made.
  std::optional<Records> train_records, val_records;
  auto train_split = [&]() -> Records& {
    if (!train_records) train_records = load_records(data.train, data.strict, log);
    return *train_records;
  };

  // 1. The tokenizer: given, or trained on the training split and cached.
  std::string model_bytes;
  if (!data.tokenizer.empty()) {
    out.tokenizer_path = data.tokenizer;
    model_bytes = read_file(data.tokenizer, "tokenizer model");
    out.tokenizer_cached = true;
  } else {
    const SourceKey key = content_key(
        {"tokenizer", std::to_string(kTokenizerRecipe), std::to_string(vocab_size), split, corpus});
    out.tokenizer_path = (fs::path(data.cache_dir) / "tokenizers" / (hex(key) + ".model")).string();
    if (fs::exists(out.tokenizer_path)) {
      model_bytes = read_file(out.tokenizer_path, "tokenizer model");
      out.tokenizer_cached = true;
    } else {
      Records& r = train_split();
      std::vector<bool> held_out = data.val.empty()
                                       ? validation_mask(r.texts.size(), data.val_fraction)
                                       : std::vector<bool>(r.texts.size(), false);
      std::vector<std::string_view> texts;
      for (size_t i = 0; i < r.texts.size(); ++i)
        if (!held_out[i]) texts.push_back(r.texts[i]);
      log.info("training a {}-piece BPE tokenizer on {} records...", vocab_size, texts.size());
      const Stopwatch training;
      try {
        model_bytes = Tokenizer::train(texts, static_cast<int32_t>(vocab_size));
      } catch (const TokenizerError& e) {
        // sentencepiece's words; the setting that decides it is ours.
        throw TokenizerError(
            "cannot train a tokenizer of model.vocab_size = " + std::to_string(vocab_size) +
                " pieces on " + data.train + ": " + e.message(),
            "a byte-fallback BPE needs at least 256 byte pieces, 3 specials "
            "and the corpus's distinct characters: raise model.vocab_size");
      }
      write_file_atomic(out.tokenizer_path, model_bytes);
      log.info("tokenizer trained in {:.2f} s -> {}", training.seconds(), out.tokenizer_path);
    }
  }
  Tokenizer tok = Tokenizer::from_bytes(model_bytes, out.tokenizer_path);
  tok.check_vocab_size(vocab_size);

  // 2. Token files, keyed on corpus, split and tokenizer content.
  const SourceKey key =
      content_key({"tokens", std::to_string(kTokenFileVersion), std::to_string(kTokenizerRecipe),
                   split, corpus, val_corpus, model_bytes});
  const fs::path dir = fs::path(data.cache_dir) / "tokens" / hex(key);
  out.train_path = (dir / "train.tok").string();
  const bool has_val = !data.val.empty() || data.val_fraction > 0;
  out.val_path = has_val ? (dir / "val.tok").string() : "";
  out.tokens_cached =
      usable(out.train_path, key, log) && (!has_val || usable(out.val_path, key, log));
  // data.strict refuses a corpus with bad lines even when its token files are cached
  // (they were made by a run that skipped the lines).
  if (data.strict && out.tokens_cached) {
    train_split();
    if (!data.val.empty()) val_records = load_records(data.val, true, log);
  }
  if (!out.tokens_cached) {
    fs::create_directories(dir);
    Records& r = train_split();
    std::vector<const std::string*> train_texts, val_texts;
    if (data.val.empty()) {
      std::vector<bool> held_out = validation_mask(r.texts.size(), data.val_fraction);
      for (size_t i = 0; i < r.texts.size(); ++i)
        (held_out[i] ? val_texts : train_texts).push_back(&r.texts[i]);
    } else {
      for (const auto& t : r.texts) train_texts.push_back(&t);
      val_records = load_records(data.val, data.strict, log);
      for (const auto& t : val_records->texts) val_texts.push_back(&t);
    }
    write_tokens(tok, train_texts, out.train_path, key, threads, "train", log);
    if (has_val) write_tokens(tok, val_texts, out.val_path, key, threads, "val", log);
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

}  // namespace minimind
