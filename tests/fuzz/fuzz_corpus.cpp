// The JSONL corpus reader, lenient and strict: records or a DataError, never a crash.
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "minimind/data/jsonl.h"
#include "minimind/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = minimind::fuzz::scratch_file(data, size);
  for (bool strict : {false, true}) {
    try {
      size_t bytes = 0;
      minimind::read_corpus(path, {strict, 5}, [&](std::string_view text, int64_t) {
        if (!minimind::is_valid_utf8(text)) __builtin_trap();  // records are valid UTF-8
        bytes += text.size();
      });
    } catch (const minimind::DataError&) {
    }
  }
  return 0;
}
