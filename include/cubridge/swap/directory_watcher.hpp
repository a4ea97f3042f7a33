#pragma once
// Watches a directory (inotify) and reports files once they are completely written and have been
// quiet for a while: the source of new module versions for hot swap (drop a .cubin in, it goes
// live). Editors and compilers write in bursts; the debounce turns a burst into one report.

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cubridge {

/// Calls `on_ready(path)` on its own thread for every file in `directory` that was closed after
/// writing or moved in, once no further event for it arrived for `debounce`. Files whose
/// extension is not in `extensions` (e.g. {".cubin", ".cu"}; empty: all) are ignored, and so are
/// hidden files (a leading '.', as editors and atomic writers use for temporaries). Exceptions
/// that `on_ready` throws are caught and passed to `on_error`.
class directory_watcher {
 public:
  using ready_callback = std::function<void(const std::filesystem::path&)>;
  using error_callback = std::function<void(const std::filesystem::path&, std::exception_ptr)>;

  /// Starts watching. @throws error (errc::io) naming the directory if it cannot be watched.
  directory_watcher(std::filesystem::path directory, std::chrono::milliseconds debounce,
                    ready_callback on_ready, std::vector<std::string> extensions = {},
                    error_callback on_error = {});
  /// Stops the thread; a callback in progress finishes first.
  ~directory_watcher();
  directory_watcher(const directory_watcher&) = delete;
  directory_watcher& operator=(const directory_watcher&) = delete;
  directory_watcher(directory_watcher&&) = delete;
  directory_watcher& operator=(directory_watcher&&) = delete;

  [[nodiscard]] const std::filesystem::path& directory() const noexcept;

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace cubridge
