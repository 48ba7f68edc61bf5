// libminimind_spm.so: sentencepiece behind a C interface (see spm_shim.h for why).
#include "minimind/data/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int fail(char* err, size_t err_len, const std::string& msg) {
  if (err && err_len > 0) {
    std::strncpy(err, msg.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return 1;
}

// Feeds the trainer from memory instead of a file.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  VectorIterator(const char* const* s, const size_t* lens, size_t n) {
    sentences_.reserve(n);
    for (size_t i = 0; i < n; ++i) sentences_.emplace_back(s[i], lens[i]);
  }
  bool done() const override { return pos_ >= sentences_.size(); }
  void Next() override { ++pos_; }
  const std::string& value() const override { return sentences_[pos_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> sentences_;
  size_t pos_ = 0;
};

}  // namespace

extern "C" {

int mm_spm_train(const char* const* sentences, const size_t* sentence_lens, size_t n,
                 const char* const* keys, const char* const* values, size_t n_options, char** model,
                 size_t* model_len, char* err, size_t err_len) {
  std::unordered_map<std::string, std::string> kwargs;
  for (size_t i = 0; i < n_options; ++i) kwargs[keys[i]] = values[i];
  VectorIterator it(sentences, sentence_lens, n);
  std::string proto;
  auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &proto);
  if (!status.ok()) return fail(err, err_len, status.ToString());
  *model = static_cast<char*>(std::malloc(proto.size()));
  std::memcpy(*model, proto.data(), proto.size());
  *model_len = proto.size();
  return 0;
}

int mm_spm_load(const char* model, size_t model_len, void** handle, char* err, size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto status = sp->LoadFromSerializedProto(std::string(model, model_len));
  if (!status.ok()) {
    delete sp;
    return fail(err, err_len, status.ToString());
  }
  *handle = sp;
  return 0;
}

void mm_spm_unload(void* handle) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

int32_t mm_spm_vocab_size(const void* handle) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize();
}

const char* mm_spm_id_to_piece(const void* handle, int32_t id) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->IdToPiece(id).c_str();
}

int mm_spm_encode(const void* handle, const char* text, size_t text_len, int32_t** ids,
                  size_t* n_ids, char* err, size_t err_len) {
  std::vector<int> out;
  auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Encode(
      std::string(text, text_len), &out);
  if (!status.ok()) return fail(err, err_len, status.ToString());
  *ids = static_cast<int32_t*>(std::malloc(std::max<size_t>(1, out.size()) * sizeof(int32_t)));
  for (size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
  *n_ids = out.size();
  return 0;
}

int mm_spm_decode(const void* handle, const int32_t* ids, size_t n_ids, char** text,
                  size_t* text_len, char* err, size_t err_len) {
  std::vector<int> in(ids, ids + n_ids);
  std::string out;
  auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Decode(in, &out);
  if (!status.ok()) return fail(err, err_len, status.ToString());
  *text = static_cast<char*>(std::malloc(std::max<size_t>(1, out.size())));
  std::memcpy(*text, out.data(), out.size());
  *text_len = out.size();
  return 0;
}

void mm_spm_free(void* buffer) {
  std::free(buffer);
}
}
