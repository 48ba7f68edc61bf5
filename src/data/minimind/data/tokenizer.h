// The tokenizer, of one of two kinds:
// - a sentencepiece BPE model with MiniMind's special ids, trained from a corpus or loaded
//   from a .model file. Any sentencepiece client (Python included) given the same .model
//   reproduces our ids: all text handling lives inside the model;
// - a Hugging Face tokenizer.json of the byte-level BPE family (MiniMind's own, GPT-2's),
//   run natively (byte_level_bpe.h): the ids of Hugging Face's Rust library.
// The kind is read from the file's bytes (a JSON object, or a sentencepiece model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "minimind/data/byte_level_bpe.h"
#include "minimind/data/chat.h"
#include "minimind/error.h"

namespace minimind {

// A run directory's copy of its tokenizer: RUN/tokenizer.json or RUN/tokenizer.model,
// whichever exists ("" if neither).
std::string run_tokenizer_file(const std::string& run_dir);
// The name a run directory keeps the tokenizer file at `path` under, by its kind.
std::string run_tokenizer_name(const std::string& path);

// The ids that pad a row and open and close a document. The defaults are MiniMind's (and
// every sentencepiece model this tool trains): <|endoftext|>, <|im_start|>, <|im_end|>.
struct SpecialIds {
  int32_t pad = 0, bos = 1, eos = 2;
  bool operator==(const SpecialIds& o) const {
    return pad == o.pad && bos == o.bos && eos == o.eos;
  }
  bool operator!=(const SpecialIds& o) const { return !(*this == o); }
};

// What kind of piece an id is (sentencepiece's kinds, numbered as its ModelProto and as
// GGUF's token types).
enum class PieceType : int32_t {
  normal = 1,
  unknown = 2,
  control = 3,       // pad, bos, eos
  user_defined = 4,  // "\n"
  unused = 5,
  byte = 6,  // byte fallback, "<0x0A>"
};

// The pad, bos and eos names a tokenizer_config.json's text gives (pad_token, bos_token,
// eos_token: a name, an object with a string "content", or null; "" where none). Anything
// else is a TokenizerError naming the field and `source` (the file).
std::vector<std::string> special_names_of_config(const std::string& text,
                                                 const std::string& source);

// The chat_template a tokenizer_config.json's text gives ("" when it has none). A value
// that is not a string (transformers' list of named templates) is a TokenizerError naming the
// field and `source`.
std::string chat_template_of_config(const std::string& text, const std::string& source);

class Tokenizer {
 public:
  // From a file's bytes (a .model or a tokenizer.json). A tokenizer.json's pad, bos and eos
  // are found by name, at any ids: `special_names` (pad, bos, eos; from a
  // tokenizer_config.json beside the file), MiniMind's <|endoftext|>, <|im_start|>,
  // <|im_end|> for a role they leave empty. TokenizerError when one is not in the file.
  static Tokenizer from_bytes(std::string model_bytes, const std::string& source,
                              const std::vector<std::string>& special_names = {});
  static Tokenizer from_file(const std::string& path);
  // "sentencepiece" or "tokenizer.json", and the file name a run directory keeps it under.
  bool is_hf_json() const { return bpe_ != nullptr; }
  const char* kind() const { return bpe_ ? "tokenizer.json" : "sentencepiece"; }
  const char* file_name() const { return bpe_ ? "tokenizer.json" : "tokenizer.model"; }
  // The byte-level BPE behind a tokenizer.json (null for sentencepiece).
  const ByteLevelBpe* byte_level_bpe() const { return bpe_.get(); }

  // Trains a BPE model of vocab_size pieces on the given texts (see tokenizer.cpp for the
  // options: byte fallback, "\n" as its own piece, no normalisation). Deterministic.
  // Returns the serialised model.
  static std::string train(const std::vector<std::string_view>& texts, int32_t vocab_size);

  const SpecialIds& specials() const { return specials_; }
  // What a run directory keeps beside its tokenizer.json, as a tokenizer_config.json: the
  // names of specials() (pad_token, bos_token, eos_token) and the chat_template read.
  std::string config_json() const;

  // How a conversation becomes text (chat.h): a tokenizer.json's chat_template, from the
  // tokenizer_config.json beside it; MiniMind-3's for a sentencepiece model, whose pad, bos
  // and eos pieces are the template's markers. TokenizerError naming the file when a
  // tokenizer.json has none, or one this tool does not render.
  ChatTemplate chat_template() const;
  // The chat_template text a tokenizer.json came with ("" for none, and for a sentencepiece
  // model, whose template the tool knows natively; exports carry chat_template_for_files).
  const std::string& chat_template_text() const { return chat_template_; }
  // The chat_template text written into files made from this tokenizer (GGUF, a Hugging Face
  // directory): the one it came with; for a sentencepiece model whose bos and eos are
  // MiniMind's turn markers (the tool's own), MiniMind-3's in our words (ChatTemplate::jinja);
  // else "".
  std::string chat_template_for_files() const;

  // The ids of a text, no bos or eos added. The special tokens' texts in it are those tokens,
  // as Hugging Face's library and llama.cpp read them: "<|im_start|>" typed in a chat is the
  // bos id, not its characters (for a sentencepiece model: its pad, bos and eos pieces).
  std::vector<int32_t> encode(std::string_view text) const;
  // A document as MiniMind stores it for training and evaluation: [bos] + encode(text) + [eos].
  std::vector<int32_t> encode_document(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  float score(int32_t id) const;  // BPE: pieces with higher scores merge first
  PieceType piece_type(int32_t id) const;
  int32_t unknown_id() const;  // the unknown piece's id, -1 without one
  int32_t vocab_size() const;
  const std::string& model_bytes() const { return bytes_; }
  // Throws TokenizerError unless the tokenizer has exactly model.vocab_size pieces.
  void check_vocab_size(int64_t model_vocab_size) const;

 private:
  struct PieceInfo {
    float score;
    PieceType type;
  };
  const std::vector<PieceInfo>& pieces() const;  // read from the model bytes once
  struct Handle;
  std::shared_ptr<Handle> handle_;
  std::shared_ptr<const ByteLevelBpe> bpe_;
  std::string bytes_;
  SpecialIds specials_;
  std::string source_;                // the file (or name) it came from, for messages
  std::string chat_template_;         // a tokenizer.json's, "" when none was beside it
  std::string chat_template_source_;  // the tokenizer_config.json it came from
};

}  // namespace minimind
