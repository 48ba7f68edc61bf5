#include "minimind/export/gguf.h"

#include <cstring>

#include "minimind/error.h"
#include "minimind/export/checked_cast.h"

namespace minimind {
namespace {

// GGUF's value types.
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 is little-endian, as GGUF is
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

}  // namespace

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  put_string(kv_, key), put<uint32_t>(kv_, kU32), put(kv_, v), ++kv_count_;
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  put_string(kv_, key), put<uint32_t>(kv_, kI32), put(kv_, v), ++kv_count_;
}
void GgufWriter::add_f32(const std::string& key, float v) {
  put_string(kv_, key), put<uint32_t>(kv_, kF32), put(kv_, v), ++kv_count_;
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  put_string(kv_, key), put<uint32_t>(kv_, kBool), put<uint8_t>(kv_, v ? 1 : 0), ++kv_count_;
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  put_string(kv_, key), put<uint32_t>(kv_, kString), put_string(kv_, v), ++kv_count_;
}
void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& v) {
  put_string(kv_, key), put<uint32_t>(kv_, kArray), put<uint32_t>(kv_, kString);
  put<uint64_t>(kv_, v.size());
  for (const std::string& s : v) put_string(kv_, s);
  ++kv_count_;
}
void GgufWriter::add_f32s(const std::string& key, const std::vector<float>& v) {
  put_string(kv_, key), put<uint32_t>(kv_, kArray), put<uint32_t>(kv_, kF32);
  put<uint64_t>(kv_, v.size());
  for (float x : v) put(kv_, x);
  ++kv_count_;
}
void GgufWriter::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  put_string(kv_, key), put<uint32_t>(kv_, kArray), put<uint32_t>(kv_, kI32);
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
  ++kv_count_;
}

void GgufWriter::add_tensor(const std::string& name, const torch::Tensor& t, GgufType type) {
  const c10::ScalarType st = type == GgufType::f32   ? torch::kFloat32
                             : type == GgufType::f16 ? torch::kFloat16
                                                     : torch::kBFloat16;
  const torch::Tensor data = checked_cast(name, t, st);
  Tensor out{name, {}, type, std::string(static_cast<const char*>(data.data_ptr()), data.nbytes())};
  for (int64_t d = data.dim() - 1; d >= 0; --d)
    out.dims.push_back(static_cast<uint64_t>(data.size(d)));
  tensors_.push_back(std::move(out));
}

std::string GgufWriter::bytes() const {
  std::string out = "GGUF";
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_count_ + 1);
  out += kv_;
  put_string(out, "general.alignment"), put<uint32_t>(out, kU32), put<uint32_t>(out, kAlignment);
  auto aligned = [](uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; };
  uint64_t offset = 0;  // from the start of the data section
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put(out, d);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put(out, offset);
    offset = aligned(offset + t.data.size());
  }
  out.resize(aligned(out.size()), '\0');
  for (const Tensor& t : tensors_) {
    out += t.data;
    out.resize(aligned(out.size()), '\0');
  }
  return out;
}

}  // namespace minimind
