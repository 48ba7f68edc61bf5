// Command-line parsing shared by the mains.
#pragma once

#include <CLI/CLI.hpp>

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

}  // namespace minimind_app
