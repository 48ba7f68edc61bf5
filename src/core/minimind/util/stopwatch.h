// Wall-clock seconds since a start point, on the steady clock: every timing the tool logs.
#pragma once

#include <chrono>

namespace minimind {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void restart() { start_ = Clock::now(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

}  // namespace minimind
