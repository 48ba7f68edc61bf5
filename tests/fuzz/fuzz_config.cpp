// The YAML config and --set: any input is a config or a ConfigError, and a config that
// validates writes YAML that reads back to the same config.
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "minimind/config.h"
#include "minimind/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    minimind::Config cfg = minimind::load_config_string(text, "fuzz.yaml");
    // The first line, as a --set assignment, on top.
    minimind::apply_override(cfg, text.substr(0, text.find('\n')));
    minimind::validate_and_resolve(cfg);
    const std::string yaml = minimind::config_to_yaml(cfg);
    minimind::Config back = minimind::load_config_string(yaml, "written.yaml");
    minimind::validate_and_resolve(back);
    if (minimind::config_to_yaml(back) != yaml) __builtin_trap();  // must round-trip
  } catch (const minimind::ConfigError&) {
  }
  return 0;
}
