#pragma once
// Waiting on a condition in tests: polls every 10 ms up to a deadline, never a fixed sleep as
// synchronisation. One helper for every test that waits on another thread, process or server.
#include <chrono>
#include <functional>
#include <thread>

namespace cubridge::testing {

/// Whether `done` became true within `deadline` (polled every 10 ms).
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace cubridge::testing
