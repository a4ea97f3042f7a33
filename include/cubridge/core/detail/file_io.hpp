#pragma once
// Reading and writing files a caller names (key files, images, payloads, bundles): only regular
// files are read, their size is checked before anything is read, and files are written through a
// temporary file renamed into place, never through a symlink at the destination.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/stat.h>

namespace cubridge::detail {

/// "4 KiB", "64 MiB", "2 GiB" when `bytes` is a whole number of them, else "123 bytes".
[[nodiscard]] std::string size_text(std::uint64_t bytes);

/// A regular file open for reading. Opening never blocks (O_NONBLOCK until the descriptor is
/// checked), so a FIFO or a device is refused instead of hanging the caller.
class regular_file {
 public:
  /// Opens `path`; `what` names it in errors ("key file", "image"). Throws cubridge::error
  /// (errc::io, call "read <what>") naming the path when it cannot be opened, when it is not a
  /// regular file (saying what it is: a directory, a FIFO, a socket, a device) and when it holds
  /// more than `max_bytes` ("'<path>' is over <max> (<size> bytes), the most a <what> may have").
  regular_file(const std::filesystem::path& path, std::uint64_t max_bytes, std::string_view what);
  ~regular_file();
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;

  /// The open descriptor's fstat: mode, size, st_dev and st_ino.
  [[nodiscard]] const struct ::stat& status() const noexcept { return status_; }
  /// Appends up to `n` more bytes to `out` (fewer only at end of file); returns how many.
  /// Throws cubridge::error (errc::io) when reading fails.
  std::size_t read_some(std::vector<std::byte>& out, std::size_t n);
  /// Appends the rest of the file to `out`. Throws cubridge::error (errc::io) when reading fails
  /// or when the file grew past `max_bytes` while it was read.
  void read_rest(std::vector<std::byte>& out);

 private:
  [[noreturn]] void fail(const std::string& why) const;
  std::filesystem::path path_;
  std::uint64_t max_bytes_;
  std::string what_;
  int fd_ = -1;
  std::uint64_t read_ = 0;
  struct ::stat status_ {};
};

/// The most an image (cubin, fatbin, PTX) or a CUDA source file that cubridge loads may have.
inline constexpr std::uint64_t max_image_bytes = std::uint64_t{2} << 30;

/// The whole of a regular file of at most `max_bytes` (see regular_file for the errors). The one
/// reader of whole files: module::load_file and library::load_file read images through it with
/// max_image_bytes.
[[nodiscard]] std::vector<std::byte> read_regular_file(const std::filesystem::path& path,
                                                       std::uint64_t max_bytes,
                                                       std::string_view what);

/// Writes `bytes` as the file `path` with permissions `mode`: into a new temporary file in the
/// same directory (O_EXCL, so never through a link), flushed, then renamed over `path` when
/// `replace`, else moved there only if nothing (not even a dangling symlink) is at `path`. A
/// symlink at `path` is replaced itself; the file it points to is never written. Throws
/// cubridge::error (errc::io, call "write <what>") naming the path: "'<path>' exists" when not
/// `replace`, or the system's reason. The temporary file is removed on failure.
void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           mode_t mode, bool replace, std::string_view what);

}  // namespace cubridge::detail
