// tokenizer.json parsing: a tokenizer or a TokenizerError, never a crash; a tokenizer that
// loads encodes a mixed text (added tokens inside it) to ids inside its vocabulary, which
// decode to valid UTF-8. (The round trip is fuzz_tokenizer_text's, on MiniMind's file: a
// made-up file may hold added tokens spelt in the byte alphabet, which decode as bytes.)
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "minimind/data/byte_level_bpe.h"
#include "minimind/data/jsonl.h"
#include "minimind/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::shared_ptr<const minimind::ByteLevelBpe> bpe;
  try {
    bpe = minimind::ByteLevelBpe::from_json(std::string(reinterpret_cast<const char*>(data), size),
                                            "fuzz.json");
  } catch (const minimind::TokenizerError&) {
    return 0;
  }
  const std::string text = "Emma <|im_start|>said 'tis 12345  \t\n 你好 🙂<|im_end|>x";
  const std::vector<int32_t> ids = bpe->encode(text);
  for (const int32_t id : ids)
    if (id < 0 || id >= bpe->vocab_size()) __builtin_trap();
  // Decoding any ids of the vocabulary gives valid UTF-8 (U+FFFD for broken bytes).
  const std::string back = bpe->decode(ids);
  if (!minimind::is_valid_utf8(back)) __builtin_trap();
  return 0;
}
