// Binary token files: the tokenised corpus, memory-mapped for training.
//
// Layout (little-endian):
//   offset 0   header, 64 bytes:
//     char     magic[8]      "MMTOKENS"
//     uint32   version       kTokenFileVersion
//     uint32   token_bytes   2 (uint16 ids, vocab <= 65536) or 4 (uint32 ids)
//     uint32   vocab_size    every id is < vocab_size
//     uint32   pad_id        the tokenizer's pad id (0 in files written before it was
//                            recorded, which is what their tokenizers used)
//     uint64   num_tokens
//     uint64   num_docs
//     uint64   source_key[2] 128-bit hash of what the file was made from (cache key)
//     uint8    padding[8]    0
//   offset 64  tokens: num_tokens ids of token_bytes each, then zero padding to 8 bytes
//   then       doc_starts: num_docs + 1 uint64; document d is tokens[doc_starts[d],
//              doc_starts[d+1]); each document is [bos] + tokens of one record + [eos]
//              (so its first and last ids are the tokenizer's bos and eos)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "minimind/error.h"

namespace minimind {

constexpr uint32_t kTokenFileVersion = 1;
using SourceKey = std::array<uint64_t, 2>;

// Streams documents to path + ".tmp" and renames it into place on finish().
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, uint32_t vocab_size, SourceKey key, uint32_t pad_id = 0);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void add_document(const std::vector<int32_t>& tokens);
  void finish();
  uint64_t num_tokens() const { return num_tokens_; }

 private:
  std::string path_, tmp_;
  uint32_t vocab_size_, token_bytes_;
  SourceKey key_;
  uint32_t pad_id_;
  std::FILE* out_ = nullptr;
  uint64_t num_tokens_ = 0;
  std::vector<uint64_t> doc_starts_{0};
};

// A read-only memory map of a token file, checked on open.
class TokenFile {
 public:
  // Throws DataError for a missing, truncated, corrupted or wrong-version file.
  static TokenFile open(const std::string& path);
  TokenFile() = default;
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;

  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t num_docs() const { return num_docs_; }
  uint32_t vocab_size() const { return vocab_size_; }
  // The id that pads a row; bos and eos are each document's first and last id.
  int64_t pad_id() const { return pad_id_; }
  int64_t bos_of(uint64_t d) const { return token(doc_starts_[d]); }
  int64_t eos_of(uint64_t d) const { return token(doc_starts_[d + 1] - 1); }
  const SourceKey& source_key() const { return key_; }
  const std::string& path() const { return path_; }

  int64_t token(uint64_t i) const {
    return token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                             : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Copies tokens [start, start + n) into out as int64.
  void copy(uint64_t start, uint64_t n, int64_t* out) const;
  uint64_t doc_start(uint64_t d) const { return doc_starts_[d]; }
  uint64_t doc_length(uint64_t d) const { return doc_starts_[d + 1] - doc_starts_[d]; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  const uint64_t* doc_starts_ = nullptr;
  uint32_t token_bytes_ = 0, vocab_size_ = 0, pad_id_ = 0;
  uint64_t num_tokens_ = 0, num_docs_ = 0;
  SourceKey key_{};
};

}  // namespace minimind
