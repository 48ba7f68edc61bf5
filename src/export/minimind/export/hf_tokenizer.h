// The tokenizer as Hugging Face's tokenizers library reads it (tokenizer.json and
// tokenizer_config.json): the same BPE, pieces, byte fallback and special tokens as the
// sentencepiece model, so that both give the same ids.
#pragma once

#include <cstdint>
#include <string>

#include "minimind/data/tokenizer.h"

namespace minimind {

// tokenizer.json: a BPE model with byte fallback whose merges are derived from the
// sentencepiece pieces (each piece that splits into two pieces merges them, earlier pieces
// first); spaces become "▁" without a prefix; [bos] is added in front of every text, as
// the model was trained.
std::string hf_tokenizer_json(const Tokenizer& tok);

// tokenizer_config.json for PreTrainedTokenizerFast.
std::string hf_tokenizer_config(const Tokenizer& tok, int64_t model_max_length);

}  // namespace minimind
