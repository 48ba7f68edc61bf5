#include "minimind/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "minimind/util/atomic_file.h"
#include "minimind/util/input_file.h"

namespace minimind {
namespace {

constexpr char kMagic[8] = {'M', 'M', 'T', 'O', 'K', 'E', 'N', 'S'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint32_t vocab_size;
  uint32_t pad_id;
  uint64_t num_tokens;
  uint64_t num_docs;
  uint64_t source_key[2];
  uint8_t padding[8];
};
static_assert(sizeof(Header) == 64, "token file header must be 64 bytes");

uint64_t align8(uint64_t n) {
  return (n + 7) / 8 * 8;
}

}  // namespace

TokenFileWriter::TokenFileWriter(std::string path, uint32_t vocab_size, SourceKey key,
                                 uint32_t pad_id)
    : path_(std::move(path)),
      tmp_(temp_path(path_)),  // per writer: two processes may prepare one cache
      vocab_size_(vocab_size),
      token_bytes_(vocab_size <= 65536 ? 2 : 4),
      key_(key),
      pad_id_(pad_id) {
  remove_stale_temps(path_);
  out_ = std::fopen(tmp_.c_str(), "wb");
  if (!out_) throw DataError("cannot write token file '" + tmp_ + "'");
  Header blank{};
  std::fwrite(&blank, sizeof(blank), 1, out_);  // the real header is written by finish()
}

TokenFileWriter::~TokenFileWriter() {
  if (out_) {  // not finished: leave nothing half-written behind
    std::fclose(out_);
    std::remove(tmp_.c_str());
  }
}

void TokenFileWriter::add_document(const std::vector<int32_t>& tokens) {
  if (token_bytes_ == 2) {
    std::vector<uint16_t> buf(tokens.begin(), tokens.end());
    std::fwrite(buf.data(), 2, buf.size(), out_);
  } else {
    std::vector<uint32_t> buf(tokens.begin(), tokens.end());
    std::fwrite(buf.data(), 4, buf.size(), out_);
  }
  num_tokens_ += tokens.size();
  doc_starts_.push_back(num_tokens_);
}

void TokenFileWriter::finish() {
  const uint64_t token_end = sizeof(Header) + num_tokens_ * token_bytes_;
  const uint64_t zeros = 0;
  std::fwrite(&zeros, 1, align8(token_end) - token_end, out_);
  std::fwrite(doc_starts_.data(), sizeof(uint64_t), doc_starts_.size(), out_);
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kTokenFileVersion;
  h.token_bytes = token_bytes_;
  h.vocab_size = vocab_size_;
  h.pad_id = pad_id_;
  h.num_tokens = num_tokens_;
  h.num_docs = doc_starts_.size() - 1;
  h.source_key[0] = key_[0];
  h.source_key[1] = key_[1];
  std::fseek(out_, 0, SEEK_SET);
  std::fwrite(&h, sizeof(h), 1, out_);
  const bool ok = std::fflush(out_) == 0 && !std::ferror(out_) && fsync(fileno(out_)) == 0;
  std::fclose(out_);
  out_ = nullptr;
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    throw DataError("writing token file '" + path_ + "' failed (disk full?)");
  }
}

TokenFile TokenFile::open(const std::string& path) {
  const InputFile file = open_input<DataError>(path, "token file");
  const uint64_t size = file.size();
  const std::string hint = "; delete it and run again to re-prepare the data";
  if (size < sizeof(Header))
    throw DataError("token file '" + path + "' is truncated (" + std::to_string(size) + " bytes)" +
                    hint);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) throw DataError("cannot map token file '" + path + "'");

  TokenFile f;
  f.path_ = path;
  f.map_ = map;
  f.map_size_ = size;
  Header h;
  std::memcpy(&h, map, sizeof(h));
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw DataError("'" + path + "' is not a minimind token file (bad magic)" + hint);
  if (h.version != kTokenFileVersion)
    throw DataError("token file '" + path + "' has format version " + std::to_string(h.version) +
                    ", this program reads version " + std::to_string(kTokenFileVersion) + hint);
  if (h.token_bytes != 2 && h.token_bytes != 4)
    throw DataError("token file '" + path + "' is corrupted (token size " +
                    std::to_string(h.token_bytes) + ")" + hint);
  const uint64_t docs_offset = align8(sizeof(Header) + h.num_tokens * h.token_bytes);
  if (h.num_tokens > size || h.num_docs > size || docs_offset + (h.num_docs + 1) * 8 != size)
    throw DataError("token file '" + path + "' is truncated or corrupted (size " +
                    std::to_string(size) + " does not match its header)" + hint);
  f.token_bytes_ = h.token_bytes;
  f.vocab_size_ = h.vocab_size;
  f.num_tokens_ = h.num_tokens;
  f.num_docs_ = h.num_docs;
  f.key_ = {h.source_key[0], h.source_key[1]};
  f.tokens_ = static_cast<const unsigned char*>(map) + sizeof(Header);
  f.doc_starts_ =
      reinterpret_cast<const uint64_t*>(static_cast<const unsigned char*>(map) + docs_offset);
  f.pad_id_ = h.pad_id;
  if (h.pad_id >= std::max<uint32_t>(h.vocab_size, 1))
    throw DataError("token file '" + path + "' is corrupted (pad id " + std::to_string(h.pad_id) +
                    ", vocabulary " + std::to_string(h.vocab_size) + ")" + hint);
  // Document table must be monotonic and cover all tokens; every document holds at least
  // its [bos] and [eos]. (Compared by difference: a start near 2^64 must not wrap past the
  // check and send a reader outside the map.)
  bool ok = f.doc_starts_[0] == 0 && f.doc_starts_[h.num_docs] == h.num_tokens;
  for (uint64_t d = 0; ok && d < h.num_docs; ++d)
    ok = f.doc_starts_[d] <= f.doc_starts_[d + 1] && f.doc_starts_[d + 1] - f.doc_starts_[d] >= 2;
  if (!ok) throw DataError("token file '" + path + "' has a corrupted document table" + hint);
  for (uint64_t i = 0; i < h.num_tokens; ++i) {
    if (f.token(i) >= h.vocab_size)
      throw DataError("token file '" + path + "' is corrupted: token " + std::to_string(i) +
                      " is " + std::to_string(f.token(i)) + " >= vocab size " +
                      std::to_string(h.vocab_size) + hint);
  }
  return f;
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_size_);
}

TokenFile::TokenFile(TokenFile&& o) noexcept {
  *this = std::move(o);
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_size_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    tokens_ = o.tokens_;
    doc_starts_ = o.doc_starts_;
    token_bytes_ = o.token_bytes_;
    vocab_size_ = o.vocab_size_;
    num_tokens_ = o.num_tokens_;
    num_docs_ = o.num_docs_;
    key_ = o.key_;
    o.map_ = nullptr;
  }
  return *this;
}

void TokenFile::copy(uint64_t start, uint64_t n, int64_t* out) const {
  for (uint64_t i = 0; i < n; ++i) out[i] = token(start + i);
}

}  // namespace minimind
