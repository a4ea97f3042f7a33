#pragma once
// What the two swap-under-load harnesses (swap_under_load.cpp, group_swap_under_load.cpp) share
// on the host side: the host clock they time with, the driver-call check, where the serving
// kernel's images lie, and a summary as JSON. (stats.hpp holds the GPU-free analysis.)
#include "stats.hpp"

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/driver.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace hotswap {

/// steady_clock, nanoseconds: every host time of the harnesses.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double us_between(std::int64_t from, std::int64_t to) {
  return static_cast<double>(to - from) / 1e3;
}

/// Throws std::runtime_error "<what>: <CUresult name>" unless `r` is CUDA_SUCCESS.
inline void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cubridge::driver::api().cuGetErrorName(r, &name);
  throw std::runtime_error(std::string(what) + ": " +
                           (name ? std::string(name) : "CUresult " + std::to_string(r)));
}

/// Where serve_v1.sm_90.cubin and its siblings lie: `requested` when given, else the program's
/// directory when they are there (a build carried to another machine), else `built` (the
/// build directory the program was compiled for).
inline std::filesystem::path find_serve_image_dir(const std::string& requested, const char* built) {
  namespace fs = std::filesystem;
  if (!requested.empty()) return requested;
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / "serve_v1.sm_90.cubin")) return self.parent_path();
  return built;
}

/// The bytes of one of those images (a regular file of at most 2 GiB, as module::load_file reads).
inline std::vector<std::byte> read_image(const std::filesystem::path& path) {
  return cubridge::detail::read_regular_file(path, cubridge::detail::max_image_bytes, "image");
}

inline nlohmann::json finite_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

inline nlohmann::json to_json(const summary& s) {
  return {{"count", s.count},
          {"min", finite_or_null(s.min)},
          {"p50", finite_or_null(s.p50)},
          {"p99", finite_or_null(s.p99)},
          {"max", finite_or_null(s.max)},
          {"mean", finite_or_null(s.mean)}};
}

}  // namespace hotswap
