// A request to stop a long run at its next safe point. The mains set it from their
// SIGINT/SIGTERM handlers (the library installs none); tests set it directly. Reading and
// writing it is async-signal-safe (a lock-free atomic).
#pragma once

#include <atomic>

namespace minimind {

class StopFlag {
 public:
  // `signal`: the signal that asked (SIGINT, SIGTERM), reported in the exit status.
  void request(int signal) noexcept { signal_.store(signal); }
  int signal() const noexcept { return signal_.load(); }  // 0: no request
  void clear() noexcept { signal_.store(0); }

 private:
  std::atomic<int> signal_{0};
  static_assert(std::atomic<int>::is_always_lock_free, "a signal handler must not take a lock");
};

}  // namespace minimind
