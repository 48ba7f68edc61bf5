// Data preparation: corpus -> tokenizer -> train/val token files, cached by content.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "minimind/config.h"
#include "minimind/data/token_file.h"
#include "minimind/util/stop_flag.h"

namespace minimind {

struct PreparedData {
  std::string tokenizer_path;     // the sentencepiece .model used
  std::string train_path;         // token files
  std::string val_path;           // "" when there is no validation split
  bool tokenizer_cached = false;  // nothing was trained
  bool tokens_cached = false;     // nothing was tokenised
  uint64_t train_tokens = 0, val_tokens = 0;
  uint64_t train_docs = 0, val_docs = 0;
};

// Makes sure a tokenizer and token files for this data config exist under
// data.cache_dir and returns their paths. Work is skipped when files made from the same
// content (corpus bytes, tokenizer bytes, split, format version) are already there; a
// changed corpus gets new files. Progress goes to `log` (a run's log includes it). Throws
// DataError / TokenizerError with a clear message; a request on `stop` (when given) ends
// the work at the next record with Interrupted, leaving the cache as it was.
PreparedData prepare_data(const DataConfig& data, int64_t vocab_size, int threads,
                          spdlog::logger& log = *spdlog::default_logger(),
                          const StopFlag* stop = nullptr);

// Checks that data.train, data.val and data.tokenizer (when set) are existing files; throws
// DataError naming the key and where it was set. A run checks this before it touches its
// run directory.
void check_data_paths(const Config& cfg);

// The content key of a file's bytes (XXH3-128, 32 hex digits), the hash the cache names its
// files by: what a run records of the weights it started from. Throws DataError.
std::string file_content_key(const std::string& path, const char* what);

// Which records of a corpus of n records are held out for validation: exactly
// ceil(fraction * n) of them (but never all: one record always stays for training), spread
// over the corpus, the same for the same n.
std::vector<bool> validation_mask(int64_t n, double fraction);

}  // namespace minimind
