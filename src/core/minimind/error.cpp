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

int run_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Interrupted& e) {
    spdlog::warn("{}", e.what());
    return 128 + e.signal();
  } catch (const std::exception& e) {
    spdlog::error("{}{}", dynamic_cast<const Error*>(&e) ? "" : "unexpected error: ", e.what());
    return 1;
  }
}

}  // namespace minimind
