// Generated text as it comes, token by token, for printing while generation runs. Decoding
// every token's whole prefix again is quadratic; this decodes a short window of recent
// tokens instead. The result equals decoding all ids at once (tested), whatever the pieces:
// SentencePiece's leading-space rule, byte-fallback pieces (<0xE2>) and UTF-8 characters
// split across tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "minimind/data/tokenizer.h"

namespace minimind {

class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tok_(tokenizer) {}
  // The new text that token `id` completes ("" while a character is unfinished).
  std::string add(int32_t id);
  // What is left after the last token (an unfinished character's replacement, say).
  std::string finish() const;
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  // The window starts where the text printed before last ended; what it decodes to beyond
  // its own start's text is new. Both decodes start at the same token, so a dropped leading
  // space cancels.
  size_t window_ = 0, printed_upto_ = 0;  // tokens
  size_t printed_ = 0;                    // bytes handed out in all
};

}  // namespace minimind
