// A Hugging Face tokenizer.json of the byte-level BPE family (GPT-2's, MiniMind's), read and
// run natively: the same ids as Hugging Face's Rust `tokenizers` library for the same file.
//
// Encoding, as that library does it for these files:
//   1. the added tokens are found first (leftmost, the longest at a position), each its id;
//   2. the text between them is split by GPT-2's pre-tokenizer regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (ICU's regex engine: Unicode classes and the lookahead; ICU 72 follows Unicode 15.0,
//      so a character assigned later is neither \p{L} nor \p{N} here, where the Rust library
//      (Unicode 16) may call it a letter);
//   3. each piece's UTF-8 bytes become GPT-2's byte alphabet (a printable character per
//      byte), and the adjacent pair of lowest merge rank is merged (leftmost on ties) until
//      no pair has a rank;
//   4. the pieces are looked up in the vocabulary.
// Decoding joins the tokens (an added token as its text), maps the byte alphabet back to
// bytes, and replaces invalid UTF-8 with U+FFFD.
//
// Anything a tokenizer.json asks for that this does not implement is refused with a
// TokenizerError naming the JSON field (a normaliser, another model or pre-tokenizer, a
// post-processor that adds ids, byte fallback, dropout, ...): never silently other ids.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace minimind {

class ByteLevelBpe {
 public:
  // From the text of a tokenizer.json; `source` names it in errors.
  static std::shared_ptr<const ByteLevelBpe> from_json(const std::string& text,
                                                       const std::string& source);

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  // The token as the file spells it: byte-alphabet characters ("Ġthe"), or an added
  // token's text.
  const std::string& token(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  int32_t id_of(const std::string& token) const;  // -1 if none
  bool is_added(int32_t id) const { return added_kind_.at(static_cast<size_t>(id)) != 0; }
  bool is_special(int32_t id) const { return added_kind_.at(static_cast<size_t>(id)) == 2; }
  // The merges in rank order, as token pairs ("Ġ", "t").
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }

 private:
  ByteLevelBpe() = default;
  static std::shared_ptr<const ByteLevelBpe> read(const nlohmann::json& j,
                                                  const std::string& source);
  void encode_piece(const std::string& bytes, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;               // by id
  std::vector<uint8_t> added_kind_;               // 0 no, 1 added, 2 added and special
  std::unordered_map<std::string, int32_t> ids_;  // the vocabulary and added tokens
  std::vector<std::pair<std::string, std::string>> merges_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;
  int32_t byte_id_[256] = {};  // each byte's byte-alphabet token
  // The added tokens, the longest first, in two passes as the Rust library splits them: the
  // tokens with "normalized": false are found in the text first, then those with true in
  // the text between.
  std::vector<std::pair<std::string, int32_t>> added_[2];  // [normalized]: (text, id)
  bool added_starts_with_[2][256] = {};  // [normalized][byte]: a token starts with it
  void split_added(std::string_view text, int pass, std::vector<int32_t>& out) const;
  uint64_t instance_;  // a number no other ByteLevelBpe of the process has (piece caches)
  struct Regex;
  std::shared_ptr<const Regex> regex_;
};

}  // namespace minimind
