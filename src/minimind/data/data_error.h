#pragma once

#include <stdexcept>

namespace minimind {

// Bad or unusable data: the message names the file (and line) and what to do.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace minimind
