// The tokenizer: a sentencepiece BPE model with MiniMind's special ids, trained from a
// corpus or loaded from a .model file. Any sentencepiece client (Python included) given
// the same .model reproduces our ids: all text handling lives inside the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "minimind/error.h"

namespace minimind {

// MiniMind's special ids.
constexpr int32_t kPadId = 0;  // <|endoftext|>
constexpr int32_t kBosId = 1;  // <|im_start|>
constexpr int32_t kEosId = 2;  // <|im_end|>

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

class Tokenizer {
 public:
  // From a serialised model (the bytes of a .model file).
  static Tokenizer from_bytes(std::string model_bytes, const std::string& source);
  static Tokenizer from_file(const std::string& path);

  // Trains a BPE model of vocab_size pieces on the given texts (see tokenizer.cpp for the
  // options: byte fallback, "\n" as its own piece, no normalisation). Deterministic.
  // Returns the serialised model.
  static std::string train(const std::vector<std::string_view>& texts, int32_t vocab_size);

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
  std::string bytes_;
  std::string source_;  // the file (or name) it came from, for messages
};

}  // namespace minimind
