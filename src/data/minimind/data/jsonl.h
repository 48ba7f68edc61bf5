// Reading MiniMind's JSONL files: one {"text": "..."} object per line (pretraining), or any
// record kind through read_records (chat data: chat.h).
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "minimind/error.h"

namespace minimind {

struct CorpusStats {
  int64_t lines = 0;
  int64_t records = 0;  // usable records
  int64_t skipped = 0;
  std::map<std::string, int64_t> skipped_by_reason;
  std::vector<int64_t> first_skipped;  // the line numbers of the first five skipped
  std::string summary(const std::string& path) const;
};

struct CorpusOptions {
  bool strict = false;    // a bad line is an error instead of a warning + skip
  int max_warnings = 20;  // warnings printed before the rest are only counted
};

// The longest line read as a record: MiniMind's records are a few kB, a novel a few MB.
// A longer line (a file that is not line-based, a corpus joined into one line) is skipped
// as a bad record without being held in memory.
constexpr size_t kMaxRecordBytes = size_t{16} << 20;

// Calls on_record(text, line_number) for each usable record, in file order. Bad lines
// (invalid JSON, invalid UTF-8, no string "text", empty text, blank line, a line over
// kMaxRecordBytes) are skipped
// with a warning naming file and line, or throw DataError when options.strict.
// A missing file, one that is not a regular file (a device, FIFO, directory) or a corpus
// without a single usable record throws DataError. Warnings go to `log`.
CorpusStats read_corpus(const std::string& path, const CorpusOptions& options,
                        const std::function<void(std::string_view text, int64_t line)>& on_record,
                        spdlog::logger& log = *spdlog::default_logger());

// The lines of a JSONL file as records of any kind: take(line, line_number) uses one and
// returns "" or says why it cannot ("invalid JSON"); blank lines, invalid UTF-8 and lines
// over kMaxRecordBytes are skipped before it sees them. A skipped line gets a warning naming
// file and line, or throws DataError when options.strict; a file without a usable record
// throws DataError saying what was `expected` ("one {\"text\": ...} object per line").
CorpusStats read_records(const std::string& path, const CorpusOptions& options,
                         const std::function<std::string(std::string_view line, int64_t n)>& take,
                         const char* expected, spdlog::logger& log = *spdlog::default_logger());

// True when s is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace minimind
