#pragma once
// Test helpers for tests that work on files: a fresh directory and a way to write into it.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace cubridge::testing {

/// A fresh directory (mkdtemp), removed with everything in it at the end of the test.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "cubridge-test-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

/// Writes `text` to `file` (replacing it), creating its directory first.
inline void write_text(const std::filesystem::path& file, std::string_view text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace cubridge::testing
