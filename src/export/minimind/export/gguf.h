// A writer of GGUF version 3, llama.cpp's model file: a header, metadata key/value pairs,
// tensor descriptions, then the tensors' data, each aligned to `general.alignment` bytes.
// Little-endian throughout. Dimensions are listed innermost first, so a torch tensor of
// shape [out, in] is described as {in, out}; its row-major bytes are ggml's layout as is.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace minimind {

// GGUF's tensor types that the exporter writes.
enum class GgufType : uint32_t { f32 = 0, f16 = 1, bf16 = 30 };

class GgufWriter {
 public:
  static constexpr uint32_t kAlignment = 32;

  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  // A tensor of any shape, converted to `type` (float32 data in, as the model holds it).
  void add_tensor(const std::string& name, const torch::Tensor& t, GgufType type);

  // The whole file.
  std::string bytes() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;  // innermost first
    GgufType type;
    std::string data;
  };
  std::string kv_;  // the encoded key/value pairs
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace minimind
