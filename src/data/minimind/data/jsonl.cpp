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
    s += first_skipped.size() == 1 ? "; line " : "; lines ";
    for (size_t i = 0; i < first_skipped.size(); ++i)
      s += (i ? ", " : "") + std::to_string(first_skipped[i]);
    if (skipped > static_cast<int64_t>(first_skipped.size())) s += ", ...";
    s += ")";
  }
  return s;
}

CorpusStats read_records(const std::string& path, const CorpusOptions& options,
                         const std::function<std::string(std::string_view, int64_t)>& take,
                         const char* expected, spdlog::logger& log) {
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
    if (stats.first_skipped.size() < 5) stats.first_skipped.push_back(line);
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
    if (const std::string why = take(line, n); !why.empty()) {
      skip(n, why);
      continue;
    }
    ++stats.records;
  }
  if (stats.records == 0)
    throw DataError("corpus '" + path + "' has no usable records (" + std::to_string(stats.lines) +
                    " lines); expected " + expected);
  return stats;
}

CorpusStats read_corpus(const std::string& path, const CorpusOptions& options,
                        const std::function<void(std::string_view, int64_t)>& on_record,
                        spdlog::logger& log) {
  auto take = [&](std::string_view line, int64_t n) -> std::string {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) return "invalid JSON";
    auto text = record.is_object() ? record.find("text") : record.end();
    if (!record.is_object() || text == record.end() || !text->is_string())
      return "no string \"text\" field";
    const std::string& s = text->get_ref<const std::string&>();
    if (s.empty()) return "empty text";
    on_record(s, n);
    return "";
  };
  return read_records(path, options, take, "one {\"text\": \"...\"} object per line", log);
}

}  // namespace minimind
