// Command-line parsing shared by the mains.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

namespace minimind_app {

// Parses the command line. Returns -1 to go on, or the exit status: 0 after --help, 1 for a
// usage error (printed by CLI11, naming the option); CLI11's own exit codes (100+) are not
// used, so that every error of the tools exits 1 as the README says.
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
