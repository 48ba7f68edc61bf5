// Token files: opening checks header, document table and token range; a file that opens
// can be read in full without leaving it.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "minimind/data/token_file.h"
#include "minimind/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = minimind::fuzz::scratch_file(data, size);
  try {
    const minimind::TokenFile f = minimind::TokenFile::open(path);
    uint64_t total = 0;
    for (uint64_t d = 0; d < f.num_docs(); ++d) {
      const uint64_t n = f.doc_length(d);
      std::vector<int64_t> tokens(n);
      f.copy(f.doc_start(d), n, tokens.data());
      for (int64_t t : tokens)
        if (t < 0 || t >= f.vocab_size()) __builtin_trap();
      total += n;
    }
    if (total != f.num_tokens()) __builtin_trap();
  } catch (const minimind::DataError&) {
  }
  return 0;
}
