// Encoding and decoding with MiniMind's tokenizer.json (tests/data/minimind-tokenizer): any
// bytes encode without a crash to ids inside the vocabulary; valid UTF-8 decodes back to
// itself, byte for byte; any ids decode to valid UTF-8.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_support.h"
#include "minimind/data/jsonl.h"
#include "minimind/data/tokenizer.h"
#include "minimind/error.h"

namespace {
const minimind::Tokenizer& tokenizer() {
  static const minimind::Tokenizer tok = minimind::Tokenizer::from_file(
      MINIMIND_SOURCE_DIR "/tests/data/minimind-tokenizer/tokenizer.json");
  return tok;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const minimind::Tokenizer& tok = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(text);
  for (const int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  if (minimind::is_valid_utf8(text) && tok.decode(ids) != text) __builtin_trap();
  // The same bytes read as ids (two bytes each, inside the vocabulary).
  std::vector<int32_t> any;
  for (size_t i = 0; i + 1 < size; i += 2) {
    uint16_t v;
    std::memcpy(&v, data + i, 2);
    any.push_back(v % tok.vocab_size());
  }
  if (!minimind::is_valid_utf8(tok.decode(any))) __builtin_trap();
  return 0;
}
