#include "minimind/export/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "minimind/export/checked_cast.h"

namespace minimind {

std::string safetensors_bytes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                              const std::string& dtype,
                              const std::map<std::string, std::string>& metadata) {
  const c10::ScalarType st = dtype == "F32"   ? torch::kFloat32
                             : dtype == "F16" ? torch::kFloat16
                                              : torch::kBFloat16;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const auto& [name, t] : tensors) {
    const torch::Tensor c = checked_cast(name, t, st);
    const size_t begin = data.size();
    data.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    header[name] = {
        {"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);  // little-endian on x86-64
  return out + text + data;
}

}  // namespace minimind
