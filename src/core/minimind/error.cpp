#include "minimind/error.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace minimind {

Error::Error(const std::string& message, const std::string& hint)
    : std::runtime_error(hint.empty() ? message : message + "\nhint: " + hint),
      message_(message),
      hint_(hint) {}

std::string first_line(const std::string& what, size_t max_chars) {
  return what.substr(0, std::min(what.find('\n'), max_chars));
}

namespace {

const char* const kOutOfMemoryHint =
    "the work needs more memory than the process may have (ulimit -v, the machine's RAM): make "
    "train.batch_size, data.max_seq_len or the model's size keys smaller (minimind-train "
    "prints its memory estimate at start-up)";

}  // namespace

bool is_out_of_memory(const std::string& what) {
  // LibTorch's CPU allocator: "[enforce fail at alloc_cpu.cpp:75] data. DefaultCPUAllocator:
  // not enough memory: you tried to allocate N bytes."
  return what.find("DefaultCPUAllocator: not enough memory") != std::string::npos ||
         what.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos;
}

int run_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Interrupted& e) {
    spdlog::warn("{}", e.what());
    return 128 + e.signal();
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory: an allocation failed\nhint: {}", kOutOfMemoryHint);
    return 1;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (!dynamic_cast<const Error*>(&e) && is_out_of_memory(what)) {
      spdlog::error("out of memory: {}\nhint: {}", first_line(what), kOutOfMemoryHint);
      return 1;
    }
    spdlog::error("{}{}", dynamic_cast<const Error*>(&e) ? "" : "unexpected error: ", what);
    return 1;
  }
}

}  // namespace minimind
