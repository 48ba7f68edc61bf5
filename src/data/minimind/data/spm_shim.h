// C interface of libminimind_spm.so, the one place that links sentencepiece.
//
// Why a separate library: Debian's libsentencepiece.so.0 carries its own protobuf 3.14
// and exports its symbols; libtorch brings protobuf 3.21. Linked into one program the two
// interpose each other and the process crashes before main(). tokenizer.cpp therefore
// loads this library with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so sentencepiece binds to
// its own protobuf and nothing of it leaks into the global symbol scope.
//
// Every function returns 0 on success; on failure it writes a NUL-terminated message into
// err (size err_len) and returns non-zero. Buffers it returns are freed with mm_spm_free.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

// Trains a model from n sentences with sentencepiece trainer options given as
// key/value pairs (values are passed verbatim, so "\n" can be a user-defined symbol).
// On success *model points to the serialised model proto of *model_len bytes.
int mm_spm_train(const char* const* sentences, const size_t* sentence_lens, size_t n,
                 const char* const* keys, const char* const* values, size_t n_options, char** model,
                 size_t* model_len, char* err, size_t err_len);

// Loads a serialised model; *handle is freed with mm_spm_unload.
int mm_spm_load(const char* model, size_t model_len, void** handle, char* err, size_t err_len);
void mm_spm_unload(void* handle);

int32_t mm_spm_vocab_size(const void* handle);
// The piece of an id (a pointer into the model, valid while it is loaded).
const char* mm_spm_id_to_piece(const void* handle, int32_t id);

// Encodes UTF-8 text; *ids (malloc'd) receives *n_ids ids.
int mm_spm_encode(const void* handle, const char* text, size_t text_len, int32_t** ids,
                  size_t* n_ids, char* err, size_t err_len);
// Decodes ids; *text (malloc'd) receives *text_len bytes.
int mm_spm_decode(const void* handle, const int32_t* ids, size_t n_ids, char** text,
                  size_t* text_len, char* err, size_t err_len);

void mm_spm_free(void* buffer);
}
