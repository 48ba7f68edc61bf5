// A writer of the safetensors format (Hugging Face): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the tensors' raw little-endian bytes, back to back in the header's order.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace minimind {

// "F32", "F16" or "BF16": what the tensors are written as.
std::string safetensors_bytes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                              const std::string& dtype,
                              const std::map<std::string, std::string>& metadata);

}  // namespace minimind
