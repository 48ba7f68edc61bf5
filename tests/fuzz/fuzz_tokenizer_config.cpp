// tokenizer_config.json (the pad, bos and eos names beside a tokenizer.json): three names or
// a TokenizerError naming the field, never a crash or another exception; a name read is the
// text of the field, whole.
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "minimind/data/tokenizer.h"
#include "minimind/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> names;
  try {
    names = minimind::special_names_of_config(text, "tokenizer_config.json");
  } catch (const minimind::TokenizerError& e) {
    if (std::string(e.what()).find("tokenizer_config.json") == std::string::npos) __builtin_trap();
    return 0;
  }
  if (names.size() != 3) __builtin_trap();
  return 0;
}
