#pragma once
// Shared by the sandbox tests (test_sandbox, test_sandbox_pool, test_sandbox_soak): bytes and
// text, the processes and descriptors this process has, a variable set for a scope, and
// exportable buffers for the GPU cases.

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/shared_device_memory.hpp>

#include "isolation_host.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::testing {

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}
inline std::string as_text(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}
inline double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

/// Whether process `pid` is gone (reaped: not even a zombie is left).
inline bool gone(pid_t pid) {
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

/// A child process of this one and its state ('Z': a zombie nobody reaped).
struct child_info {
  pid_t pid = 0;
  char state = '?';
};

/// This process's children, from /proc/<pid>/stat (pid (comm) state ppid ...).
inline std::vector<child_info> children() {
  std::vector<child_info> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;  // ended meanwhile
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 4 >= stat.size()) continue;
    const char state = stat[close + 2];
    const pid_t parent = static_cast<pid_t>(std::stol(stat.substr(close + 4)));
    if (parent == ::getpid()) found.push_back({static_cast<pid_t>(std::stol(name)), state});
  }
  return found;
}

/// How many of this process's children are zombies.
inline std::size_t zombie_children() {
  std::size_t n = 0;
  for (const auto& c : children()) n += c.state == 'Z';
  return n;
}

/// How many descriptors this process has open.
inline std::size_t open_fd_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

/// Sets a variable of this process for the scope (the worker's environment is read at start).
struct scoped_env {
  scoped_env(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~scoped_env() {
    if (old_.empty())
      ::unsetenv(name_);
    else
      ::setenv(name_, old_.c_str(), 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::string old_;
};

/// A VMM buffer the worker can import, holding `values`.
inline shared_device_memory exportable_buffer(std::vector<unsigned>& values,
                                              std::size_t bytes = 1 << 22) {
  auto memory = shared_device_memory::allocate(device::get(0), bytes, memory_export::posix_fd);
  values = pattern(memory.size_bytes() / sizeof(unsigned), 0xb0b);
  CUBRIDGE_CU(cuMemcpy,
              (memory.address(), reinterpret_cast<CUdeviceptr>(values.data()), memory.size_bytes()),
              "filling the shared buffer");
  return memory;
}

/// How many elements of `memory` differ from values + add.
inline std::size_t wrong_elements(const shared_device_memory& memory,
                                  const std::vector<unsigned>& values, unsigned add) {
  std::vector<unsigned> back(values.size());
  if (driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), memory.address(),
                             memory.size_bytes()) != CUDA_SUCCESS)
    return values.size();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) wrong += back[i] != values[i] + add;
  return wrong;
}

}  // namespace cubridge::testing
