#include "minimind/error.h"

#include <spdlog/spdlog.h>

namespace minimind {

Error::Error(const std::string& message, const std::string& hint)
    : std::runtime_error(hint.empty() ? message : message + "\nhint: " + hint),
      message_(message),
      hint_(hint) {}

int run_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    spdlog::error("{}{}", dynamic_cast<const Error*>(&e) ? "" : "unexpected error: ", e.what());
    return 1;
  }
}

}  // namespace minimind
