// A checkpoint's state.json: a TrainState or a CheckpointError naming the field.
#include <cstdint>
#include <string>

#include "minimind/run/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const minimind::TrainState s = minimind::parse_checkpoint_state(
        std::string(reinterpret_cast<const char*>(data), size), "state.json");
    if (s.step < 0 || s.tokens < 0) __builtin_trap();
  } catch (const minimind::CheckpointError&) {
  }
  return 0;
}
