// Finding a --config argument: a file, or a shipped preset by name.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <filesystem>

#include "minimind/config.h"
#include "minimind/error.h"
#include "minimind/util/output_path.h"

namespace fs = std::filesystem;

namespace minimind {

std::string program_dir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

std::vector<std::string> preset_dirs() {
  // Installed (cmake --install: bin/ beside share/minimind/configs), then the source tree
  // this program was built from (running from build/app/).
  std::vector<std::string> dirs;
  for (const fs::path& d : {fs::path(program_dir()) / ".." / "share" / "minimind" / "configs",
                            fs::path(MINIMIND_PRESET_DIR)}) {
    std::error_code ec;
    if (fs::is_directory(d, ec)) dirs.push_back(fs::weakly_canonical(d, ec).string());
  }
  return dirs;
}

std::vector<std::pair<std::string, std::string>> list_presets() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& dir : preset_dirs()) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".yaml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const std::string name = f.stem().string();
      const bool seen =
          std::any_of(out.begin(), out.end(), [&](const auto& p) { return p.first == name; });
      if (!seen) out.emplace_back(name, f.string());  // the first directory wins
    }
  }
  return out;
}

std::string find_config_file(const std::string& arg) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) return arg;
  if (fs::is_directory(arg, ec))
    throw ConfigError("config error: '" + arg + "' is a directory, not a YAML config file");
  if (fs::exists(arg, ec))  // a FIFO, device or socket: never opened (it could block)
    throw ConfigError("config error: '" + arg + "' is " + path_kind(arg) +
                      ", not a YAML config file");
  // A bare name (no directory part) may be a preset: "moe" or "moe.yaml".
  const fs::path p(arg);
  std::string names;
  for (const auto& [name, path] : list_presets()) {
    if (!p.has_parent_path() && (arg == name || arg == name + ".yaml")) return path;
    names += (names.empty() ? "" : ", ") + name;
  }
  throw ConfigError("config error: no config file '" + arg + "'" +
                        (p.has_parent_path() ? "" : ", and no preset of that name"),
                    names.empty() ? "no presets found beside this program"
                                  : "the shipped presets are " + names +
                                        " (minimind-train --list-presets shows where)");
}

}  // namespace minimind
