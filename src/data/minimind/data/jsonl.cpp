#include "minimind/data/jsonl.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "minimind/util/input_file.h"

namespace minimind {

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else
      return false;
    if (i + n >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

std::string CorpusStats::summary(const std::string& path) const {
  std::string s = path + ": " + std::to_string(records) + " records";
  if (skipped > 0) {
    s += ", " + std::to_string(skipped) + " skipped (";
    bool first = true;
    for (const auto& [reason, n] : skipped_by_reason) {
      s += (first ? "" : ", ") + std::to_string(n) + " " + reason;
      first = false;
    }
    s += ")";
  }
  return s;
}

CorpusStats read_corpus(const std::string& path, const CorpusOptions& options,
                        const std::function<void(std::string_view, int64_t)>& on_record,
                        spdlog::logger& log) {
  // A device or FIFO never ends (/dev/zero) or blocks (a pipe nobody writes).
  InputFile in = open_input<DataError>(path, "corpus", "a JSONL file");
  CorpusStats stats;
  int warned = 0;
  auto skip = [&](int64_t line, const std::string& reason) {
    if (options.strict)
      throw DataError(path + ":" + std::to_string(line) + ": " + reason +
                      " (data.strict is on; set it to false to skip bad records)");
    ++stats.skipped;
    ++stats.skipped_by_reason[reason];
    if (warned < options.max_warnings) {
      log.warn("{}:{}: {}; record skipped", path, line, reason);
      if (++warned == options.max_warnings)
        log.warn("{}: further bad records are only counted", path);
    }
  };

  std::string line;
  LineReader lines(in);
  bool cut = false;
  while (lines.next(line, kMaxRecordBytes, cut)) {
    const int64_t n = ++stats.lines;
    if (cut) {
      skip(n, fmt::format("record over {} MiB", kMaxRecordBytes >> 20));
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
    if (line.find_first_not_of(" \t") == std::string::npos) {
      skip(n, "blank line");
      continue;
    }
    if (!is_valid_utf8(line)) {
      skip(n, "invalid UTF-8");
      continue;
    }
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) {
      skip(n, "invalid JSON");
      continue;
    }
    auto text = record.is_object() ? record.find("text") : record.end();
    if (!record.is_object() || text == record.end() || !text->is_string()) {
      skip(n, "no string \"text\" field");
      continue;
    }
    const std::string& s = text->get_ref<const std::string&>();
    if (s.empty()) {
      skip(n, "empty text");
      continue;
    }
    ++stats.records;
    on_record(s, n);
  }
  if (stats.records == 0)
    throw DataError("corpus '" + path + "' has no usable records (" + std::to_string(stats.lines) +
                    " lines); expected one {\"text\": \"...\"} "
                    "object per line");
  return stats;
}

}  // namespace minimind
