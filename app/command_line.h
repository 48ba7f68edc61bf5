// Command-line parsing and the console, shared by the mains.
#pragma once

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

namespace minimind_app {

// "warning: " and "error: " before such lines; nothing before an ordinary one.
class LevelWord : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const char* word = msg.level == spdlog::level::warn  ? "warning: "
                       : msg.level >= spdlog::level::err ? "error: "
                                                         : "";
    dest.append(word, word + std::strlen(word));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<LevelWord>();
  }
};

// Display columns of UTF-8 text: one per character, none for combining marks (the bar of
// "H̄" is U+0304).
inline size_t display_columns(const char* begin, const char* end) {
  size_t n = 0;
  for (const char* p = begin; p < end; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const bool combining =
        p + 1 < end && ((c == 0xCC && static_cast<unsigned char>(p[1]) >= 0x80) ||
                        (c == 0xCD && static_cast<unsigned char>(p[1]) <= 0xAF));
    if (!combining) ++n;
  }
  return n;
}

// Formats as `inner` does, then breaks a line wider than `width` columns at spaces, the
// rest indented under the message: a long warning stays readable in a terminal of 120
// columns or a narrower one.
// (train.log has a formatter of its own and keeps whole lines.)
class WrappingFormatter : public spdlog::formatter {
 public:
  WrappingFormatter(std::unique_ptr<spdlog::formatter> inner, size_t width, size_t indent)
      : inner_(std::move(inner)), width_(width), indent_(indent) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    spdlog::memory_buf_t text;
    inner_->format(msg, text);
    // Each line of the message (an error's hint is a line of its own) wrapped by itself.
    const char* p = text.data();
    const char* const end = text.data() + text.size();
    while (p < end) {
      const char* eol = std::find(p, end, '\n');
      wrap(p, eol, dest);
      if (eol == end) break;
      dest.push_back('\n');
      p = eol + 1;
    }
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<WrappingFormatter>(inner_->clone(), width_, indent_);
  }

 private:
  // Appends [p, eol) broken at spaces into lines of at most width_ columns.
  void wrap(const char* p, const char* eol, spdlog::memory_buf_t& dest) const {
    size_t lead = 0;  // columns of the indent on continuation lines
    while (display_columns(p, eol) + lead > width_) {
      // The last space that keeps the line within the width (none: the rest stays whole).
      const char* cut = nullptr;
      for (const char* q = p; q < eol && display_columns(p, q) + lead <= width_; ++q)
        if (*q == ' ') cut = q;
      if (cut == nullptr || cut == p) break;
      dest.append(p, cut);
      dest.push_back('\n');
      for (size_t i = 0; i < indent_; ++i) dest.push_back(' ');
      lead = indent_;
      p = cut + 1;
    }
    dest.append(p, eol);
  }

  std::unique_ptr<spdlog::formatter> inner_;
  size_t width_, indent_;
};

// The width console lines are wrapped at: MINIMIND_CONSOLE_WIDTH when set (0: never wrap,
// one message per line, for scripts that grep), else the terminal's width on a terminal
// (at most 120, at least 60), else 120.
inline size_t console_width() {
  if (const char* env = std::getenv("MINIMIND_CONSOLE_WIDTH"); env && *env) {
    char* end = nullptr;
    const long w = std::strtol(env, &end, 10);
    if (*end == '\0' && w >= 0) return w == 0 ? 0 : std::max<size_t>(static_cast<size_t>(w), 40);
  }
  winsize ws{};
  if (isatty(STDERR_FILENO) && ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return std::clamp<size_t>(ws.ws_col, 60, 120);
  return 120;
}

// The console of every tool: stderr (stdout carries only data), each line after a short
// time stamp ("12:03:45 step 100/300 ..."), lines wrapped at console_width() with the rest
// of a long message indented under it, on a terminal or not.
inline void use_console_logger(const std::string& name) {
  auto log = spdlog::stderr_color_mt(name);
  auto pattern = std::make_unique<spdlog::pattern_formatter>();
  pattern->add_flag<LevelWord>('*').set_pattern("%H:%M:%S %^%*%$%v");
  if (const size_t width = console_width(); width > 0)
    log->set_formatter(std::make_unique<WrappingFormatter>(std::move(pattern), width, 11));
  else
    log->set_formatter(std::move(pattern));
  spdlog::set_default_logger(log);
}

// Parses the command line. Returns -1 to go on, or the exit status: 0 after --help, 1 for a
// usage error (printed by CLI11, naming the option); CLI11's own exit codes (100+) are not
// used, so that every error of the tools exits 1 as docs/training.md says.
inline int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
}

// An integer from lo to hi, checked on the text: CLI11 2.1 turns a value past the type's
// range into the largest one without a word (--seed 99999999999999999999 became 2^63-1).
inline CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < lo || v > hi)
          return "must be " + range + ", got \"" + text + "\"";
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// A finite number from lo to hi (CLI11's Range lets nan through).
inline CLI::Validator number_in(double lo, double hi) {
  auto show = [](double v) {
    std::ostringstream out;
    out << v;
    return out.str();
  };
  const std::string range = "a number from " + show(lo) + " to " + show(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi)
          return "must be " + range + ", got \"" + text + "\"";
        return {};
      },
      "NUMBER in [" + show(lo) + ", " + show(hi) + "]");
}

}  // namespace minimind_app
