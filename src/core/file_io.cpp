// Reading and writing named files without hanging on a FIFO, reading a huge file whole, or
// writing through a symlink (detail/file_io.hpp).
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace cubridge::detail {
namespace {

std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

// What a non-regular file is, for "'x' is a FIFO, not a regular file".
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

}  // namespace

std::string size_text(std::uint64_t bytes) {
  constexpr std::uint64_t kib = 1024, mib = kib << 10, gib = mib << 10;
  if (bytes != 0 && bytes % gib == 0) return std::to_string(bytes / gib) + " GiB";
  if (bytes != 0 && bytes % mib == 0) return std::to_string(bytes / mib) + " MiB";
  if (bytes != 0 && bytes % kib == 0) return std::to_string(bytes / kib) + " KiB";
  return std::to_string(bytes) + " bytes";
}

regular_file::regular_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                           std::string_view what)
    : path_(path), max_bytes_(max_bytes), what_(what) {
  // O_NONBLOCK: opening a FIFO with no writer (or a device) must not wait; checked below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) fail("cannot open " + quoted(path_) + ": " + std::strerror(errno));
  if (::fstat(fd_, &status_) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    fail("cannot stat " + quoted(path_) + ": " + std::strerror(e));
  }
  std::string problem;
  if (!S_ISREG(status_.st_mode)) {
    problem = quoted(path_) + " is " + kind_of(status_.st_mode) + ", not a regular file";
  } else if (static_cast<std::uint64_t>(status_.st_size) > max_bytes_) {
    problem = quoted(path_) + " is over " + size_text(max_bytes_) + " (" +
              std::to_string(status_.st_size) + " bytes), the most a " + what_ + " may have";
  } else if (const int flags = ::fcntl(fd_, F_GETFL);
             flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    problem = "cannot read " + quoted(path_) + ": " + std::strerror(errno);
  }
  if (!problem.empty()) {
    ::close(fd_);
    fd_ = -1;
    fail(problem);
  }
}

regular_file::~regular_file() {
  if (fd_ >= 0) ::close(fd_);
}

void regular_file::fail(const std::string& why) const {
  throw_errc(errc::io, "read " + what_, why);
}

std::size_t regular_file::read_some(std::vector<std::byte>& out, std::size_t n) {
  const auto old = out.size();
  out.resize(old + n);
  std::size_t got = 0;
  while (got < n) {
    const auto r = ::read(fd_, out.data() + old + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      out.resize(old + got);
      fail("reading " + quoted(path_) + " failed: " + std::strerror(errno));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  out.resize(old + got);
  read_ += got;
  return got;
}

void regular_file::read_rest(std::vector<std::byte>& out) {
  // The size fstat saw first, then in chunks until end of file, one byte past the limit at most.
  constexpr std::size_t chunk = std::size_t{1} << 16;
  const auto expected = static_cast<std::uint64_t>(status_.st_size);
  const auto remaining = static_cast<std::size_t>(expected > read_ ? expected - read_ : 0);
  out.reserve(out.size() + remaining + chunk);  // the read that sees the end stays in place
  if (remaining != 0) read_some(out, remaining);
  while (read_ <= max_bytes_) {
    const auto allowed = max_bytes_ - read_;  // then one byte more, to see it is over
    const auto want = allowed >= chunk ? chunk : static_cast<std::size_t>(allowed) + 1;
    if (read_some(out, want) == 0) return;
  }
  fail(quoted(path_) + " grew over " + size_text(max_bytes_) + " while it was read, the most a " +
       what_ + " may have");
}

std::vector<std::byte> read_regular_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                                         std::string_view what) {
  regular_file file(path, max_bytes, what);
  std::vector<std::byte> out;
  file.read_rest(out);
  return out;
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           mode_t mode, bool replace, std::string_view what) {
  const std::string call = "write " + std::string(what);
  auto fail = [&](const std::string& why) { throw_errc(errc::io, call, why); };
  if (path.filename().empty()) fail(quoted(path) + " names a directory, not a file");
  if (!replace) {
    struct ::stat st {};
    if (::lstat(path.c_str(), &st) == 0) fail(quoted(path) + " exists");
  }
  // mkostemp: a fresh name, O_EXCL, mode 0600 until fchmod; in the same directory so that the
  // rename below stays on one file system.
  std::string temp = (path.parent_path() / ("." + path.filename().string() + ".XXXXXX")).string();
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0)
    fail("cannot create a temporary file next to " + quoted(path) + ": " + std::strerror(errno));
  std::string problem;  // the system's reason, when something failed
  bool exists = false;  // not `replace`, and something is at `path`
  if (::fchmod(fd, mode) != 0) problem = std::strerror(errno);
  for (std::size_t done = 0; problem.empty() && done < bytes.size();) {
    const auto w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      problem = std::strerror(errno);
    else
      done += static_cast<std::size_t>(w);
  }
  if (problem.empty() && ::fsync(fd) != 0) problem = std::strerror(errno);
  if (::close(fd) != 0 && problem.empty()) problem = std::strerror(errno);
  if (problem.empty()) {
    if (replace) {
      if (::rename(temp.c_str(), path.c_str()) != 0) problem = std::strerror(errno);
    } else if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
      // A file system without RENAME_NOREPLACE: link(2) also refuses an existing name.
      if (errno == EEXIST) {
        exists = true;
      } else if (errno != EINVAL && errno != ENOSYS) {
        problem = std::strerror(errno);
      } else if (::link(temp.c_str(), path.c_str()) != 0) {
        if (errno == EEXIST)
          exists = true;
        else
          problem = std::strerror(errno);
      } else {
        ::unlink(temp.c_str());
      }
    }
  }
  if (exists || !problem.empty()) {
    ::unlink(temp.c_str());
    if (exists) fail(quoted(path) + " exists");
    fail("cannot write " + quoted(path) + ": " + problem);
  }
  // The rename is durable only once the directory is flushed: without it a crash could bring
  // back the old file (an old replay state, a key that was replaced).
  const auto directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    fail("cannot open the directory of " + quoted(path) + " to flush it: " + std::strerror(errno));
  const bool flushed = ::fsync(dir) == 0;
  const int fsync_error = errno;
  ::close(dir);
  if (!flushed)
    fail("cannot flush the directory of " + quoted(path) + ": " + std::strerror(fsync_error));
}

}  // namespace cubridge::detail
