#pragma once
// Shared by the isolation tests (guest context, sandbox): the host's state a misbehaving library
// may damage, how to check it, and the test library's entry points (tests/guest_lib).

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>

#include "gpu_test.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace cubridge::testing {

/// FNV-1a over the words, for printing a checksum of a buffer.
inline std::uint64_t checksum(const std::vector<unsigned>& words) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned w : words)
    for (int i = 0; i < 4; ++i) h = (h ^ ((w >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

inline std::vector<unsigned> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned>(i * 2654435761u) ^ seed;
  return v;
}

/// The host: device 0's primary context current on this thread, a buffer in it holding a known
/// pattern (its checksum taken before the library runs), and the test kernels loaded in it.
class isolation_host {
 public:
  static constexpr std::size_t words = 1 << 16;

  isolation_host()
      : primary(primary_context::retain(device::get(0))),
        current_(primary),
        expected(pattern(words, 0x5eed)),
        buffer(driver_buffer<unsigned>::allocate(primary, words)),
        scratch(driver_buffer<unsigned>::allocate(primary, words)),
        kernels(module::load_file(primary, test_cubin_path())),
        fill(kernels.get_kernel("fill_u32")) {
    CUBRIDGE_CU(cuMemcpy,
                (buffer.address(), reinterpret_cast<CUdeviceptr>(expected.data()),
                 words * sizeof(unsigned)),
                "filling the host buffer");
    expected_checksum = checksum(expected);
  }

  /// "" when the host buffer still holds its pattern, else what happened to it.
  [[nodiscard]] std::string buffer_damage() const {
    std::vector<unsigned> back(words, 0);
    const CUresult r = driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()),
                                              buffer.address(), words * sizeof(unsigned));
    if (r != CUDA_SUCCESS)
      return "host buffer unreadable: cuMemcpy " + detail::driver_error_name(r);
    if (back != expected)
      return "host buffer changed: checksum " + std::to_string(checksum(back)) + ", expected " +
             std::to_string(expected_checksum);
    return {};
  }

  /// "" when a host kernel still launches and computes, else why not.
  [[nodiscard]] std::string kernel_damage() const {
    try {
      fill.launch({.grid = {unsigned(words / 256)},
                   .block = {256},
                   .stream = cubridge::stream_ref::legacy_default()},
                  scratch.span(), 7u, words);
      if (const CUresult r = driver::api().cuCtxSynchronize(); r != CUDA_SUCCESS)
        return "host kernel failed: cuCtxSynchronize " + detail::driver_error_name(r);
      std::vector<unsigned> back(words, 0);
      if (const CUresult r = driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()),
                                                    scratch.address(), words * sizeof(unsigned));
          r != CUDA_SUCCESS)
        return "host kernel result unreadable: cuMemcpy " + detail::driver_error_name(r);
      for (unsigned v : back)
        if (v != 7u) return "host kernel wrote wrong values";
      return {};
    } catch (const std::exception& e) {
      return std::string("host kernel launch failed: ") + e.what();
    }
  }

  primary_context primary;

 private:
  scoped_current current_;

 public:
  std::vector<unsigned> expected;
  std::uint64_t expected_checksum = 0;
  driver_buffer<unsigned> buffer;
  driver_buffer<unsigned> scratch;
  module kernels;
  kernel fill;
};

/// The test library (tests/guest_lib), loaded once per process.
inline void* guest_library() {
  static void* handle = dlopen(CUBRIDGE_TEST_GUEST_LIB, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "cannot load %s: %s\n", CUBRIDGE_TEST_GUEST_LIB, dlerror());
    std::exit(2);
  }
  return handle;
}

inline cubridge_sandbox_entry guest_entry(const char* name) {
  auto entry = reinterpret_cast<cubridge_sandbox_entry>(dlsym(guest_library(), name));
  if (!entry) {
    std::fprintf(stderr, "the test library has no %s\n", name);
    std::exit(2);
  }
  return entry;
}

/// Calls an entry of the test library directly, in this process.
inline int call_guest(const char* name,
                      std::initializer_list<cubridge_sandbox_buffer> buffers = {}) {
  std::vector<cubridge_sandbox_buffer> list(buffers);
  cubridge_sandbox_args args{};
  args.struct_size = sizeof args;
  args.abi_version = CUBRIDGE_SANDBOX_ABI_VERSION;
  args.buffers = list.data();
  args.buffer_count = list.size();
  return guest_entry(name)(&args);
}

/// Collects a child process's expectations; exit() ends it with 0 only if all held.
class verdict {
 public:
  void expect(bool condition, const std::string& what) {
    if (!condition) failures_ += "  FAILED: " + what + "\n";
  }
  /// To stderr, where the parent's exit expectation matches it, and to stdout, which a passing
  /// death test still shows (the matrix logs keep restart times and what each protection saw).
  void note(const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::printf("  note: %s\n", line.c_str());
  }
  [[noreturn]] void exit() {
    std::fflush(stdout);
    if (!failures_.empty()) std::fprintf(stderr, "%s", failures_.c_str());
    std::fflush(stderr);
    std::_Exit(failures_.empty() ? 0 : 1);  // no teardown in a process whose CUDA was damaged
  }

 private:
  std::string failures_;
};

}  // namespace cubridge::testing
