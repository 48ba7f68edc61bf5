// The .pth / .pt readers (torch.save's zip + pickle format, read by LibTorch's unpickler) and
// loading into a small model: weights or a WeightsError.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "minimind/config.h"
#include "minimind/model/weights_io.h"

namespace {
minimind::MiniMindForCausalLM* model = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  minimind::Config cfg = minimind::load_config_string(
      "model: {hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 32, max_position_embeddings: 512}\n",
      "fuzz");
  minimind::validate_and_resolve(cfg);
  model = new minimind::MiniMindForCausalLM(cfg.model);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = minimind::fuzz::scratch_file(data, size);
  try {
    minimind::read_tensor_dict(path);
  } catch (const minimind::WeightsError&) {
  }
  try {
    minimind::load_weights(*model, path);
  } catch (const minimind::WeightsError&) {
  }
  return 0;
}
