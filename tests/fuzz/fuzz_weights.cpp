// The .pth / .pt readers (torch.save's zip + pickle format, read by LibTorch's unpickler):
// loading into a small model, as an optimizer state and as an RNG state (the three torch
// files of a checkpoint): each succeeds or throws our error, never crashes.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "fuzz_support.h"
#include "minimind/config.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/optimizer_state.h"

// A damaged pickle may declare a string or record of gigabytes, which LibTorch allocates
// before it finds the file too short. In a normal build an impossible allocation throws
// std::bad_alloc (caught and reported as a damaged file); ASan's own operator new aborts
// instead. These replacements restore the normal behaviour on top of ASan's malloc, which
// still checks every access (scripts/fuzz.sh sets allocator_may_return_null=1).
void* operator new(size_t n) {
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace {
minimind::MiniMindForCausalLM* model = nullptr;
torch::optim::AdamW* optimizer = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  minimind::Config cfg = minimind::load_config_string(
      "model: {hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 32, max_position_embeddings: 512}\n",
      "fuzz");
  minimind::validate_and_resolve(cfg);
  model = new minimind::MiniMindForCausalLM(cfg.model);
  optimizer = new torch::optim::AdamW((*model)->parameters());
  // MINIMIND_FUZZ_WRITE_SEED=FILE writes this optimizer's state after one step: the seed
  // tests/fuzz/seeds/weights/optimizer.pt (a fitting state reaches the deepest checks).
  if (const char* seed = std::getenv("MINIMIND_FUZZ_WRITE_SEED")) {
    for (auto& p : (*model)->parameters()) p.mutable_grad() = torch::ones_like(p);
    optimizer->step();
    const std::vector<char> bytes = minimind::optimizer_state_bytes(*optimizer);
    std::FILE* f = std::fopen(seed, "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    std::exit(0);
  }
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
  try {
    minimind::load_optimizer_state(*optimizer, path, minimind::kCheckpointVersion);
  } catch (const minimind::Error&) {  // WeightsError (no pickle) or CheckpointError
  }
  try {
    minimind::restore_rng_state(path);
  } catch (const minimind::Error&) {
  }
  return 0;
}
