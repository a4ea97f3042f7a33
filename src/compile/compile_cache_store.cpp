// The compile cache's on-disk store: its own names, verified reads, atomic writes, and cleanup
// with least-recently-used eviction, all relative to the checked directory's descriptor.
#include "compile_cache_store.hpp"

#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include "compile_cache_directory.hpp"
#include "compile_cache_entry.hpp"
#include "detail/ensure_sodium.hpp"

#include <sodium.h>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>

namespace cubridge::compile_cache_internal {

namespace {

constexpr std::string_view entry_suffix = ".entry";
// ".tmp-cubridge-<64 hex>-<pid>-<counter>-<16 hex>": the only temporary files cleanup removes.
constexpr std::string_view temp_prefix = ".tmp-cubridge-";
// A temporary file this old belongs to a writer that crashed; a live writer needs milliseconds.
constexpr std::time_t stale_temp_seconds = 3600;

bool is_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
bool is_decimal(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// "<64 hex>.entry": the only names read as entries or evicted.
bool is_entry_name(std::string_view name) {
  return name.size() == 64 + entry_suffix.size() && name.ends_with(entry_suffix) &&
         is_hex(name.substr(0, 64));
}

/// ".tmp-cubridge-<64 hex>-<pid>-<counter>-<16 hex>", as make_temp_name spells them.
bool is_own_temp_name(std::string_view name) {
  if (!name.starts_with(temp_prefix)) return false;
  name.remove_prefix(temp_prefix.size());
  if (name.size() < 64 + 1 || !is_hex(name.substr(0, 64)) || name[64] != '-') return false;
  name.remove_prefix(65);
  const std::size_t pid_end = name.find('-');
  if (pid_end == std::string_view::npos || !is_decimal(name.substr(0, pid_end))) return false;
  name.remove_prefix(pid_end + 1);
  const std::size_t counter_end = name.find('-');
  if (counter_end == std::string_view::npos || !is_decimal(name.substr(0, counter_end)))
    return false;
  name.remove_prefix(counter_end + 1);
  return name.size() == 16 && is_hex(name);
}

/// An entry trim may evict, as the listing saw it.
struct listed_entry {
  std::int64_t used_ns;
  std::uint64_t size;
  std::string name;
  struct stat seen;
};

/// Lists the directory's entries and removes the stale temporary files it meets. Looks only at
/// the cache's own names that are regular files of the user's; everything else is left alone.
std::vector<listed_entry> list_entries(int directory_fd, const std::filesystem::path& directory) {
  std::vector<listed_entry> entries;
  const std::time_t now = std::time(nullptr);
  // A descriptor of its own for the listing: readdir moves the offset of the one it reads.
  unique_fd listing(::openat(directory_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* raw = listing ? ::fdopendir(listing.get()) : nullptr;
  if (!raw)
    detail::throw_errc(
        errc::io, "fdopendir",
        "listing compile cache '" + directory.string() + "': " + std::strerror(errno));
  (void)listing.release();  // closedir closes it
  const std::unique_ptr<DIR, int (*)(DIR*)> dir(raw, ::closedir);
  const uid_t user = ::geteuid();
  while (const dirent* item = ::readdir(dir.get())) {
    const std::string name = item->d_name;
    const bool is_entry = is_entry_name(name);
    if (!is_entry && !is_own_temp_name(name)) continue;
    struct stat info {};
    if (::fstatat(directory_fd, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(info.st_mode) || info.st_uid != user) continue;
    if (!is_entry) {
      if (now - info.st_mtim.tv_sec > stale_temp_seconds) remove_if_same(directory_fd, name, info);
      continue;
    }
    const std::int64_t used_ns =
        std::int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
    entries.push_back({used_ns, static_cast<std::uint64_t>(info.st_size), name, info});
  }
  return entries;
}

}  // namespace

std::string entry_name(std::string_view key_hex) {
  return std::string(key_hex) + std::string(entry_suffix);
}

std::string make_temp_name(std::string_view tag_hex) {
  static std::atomic<std::uint64_t> counter{0};
  detail::ensure_sodium();
  std::array<unsigned char, 8> random{};
  randombytes_buf(random.data(), random.size());
  const std::string suffix = detail::to_hex(random);
  return std::string(temp_prefix) + std::string(tag_hex) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + suffix;
}

bool write_all(int fd, const unsigned char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, unsigned char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

read_outcome read_entry(int directory_fd, const std::string& name, const mac_key& secret,
                        const hash_value& key, compiled_image& out, struct stat& found) {
  // Checked before opening, so a FIFO or a device is never opened, and again on the
  // descriptor, so a file swapped in between is caught; O_NONBLOCK so nothing can block.
  if (::fstatat(directory_fd, name.c_str(), &found, AT_SYMLINK_NOFOLLOW) != 0)
    return read_outcome::absent;
  if (!safe_file(found)) return read_outcome::refused;
  const unique_fd fd(
      ::openat(directory_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return errno == ENOENT ? read_outcome::absent : read_outcome::refused;
  if (::fstat(fd.get(), &found) != 0) return read_outcome::absent;
  if (!safe_file(found)) return read_outcome::refused;
  if (found.st_size < 0 || static_cast<std::uint64_t>(found.st_size) < entry_header_bytes ||
      static_cast<std::uint64_t>(found.st_size) > max_entry_bytes)
    return read_outcome::corrupt;
  std::vector<unsigned char> bytes(static_cast<std::size_t>(found.st_size));
  if (!read_all(fd.get(), bytes.data(), bytes.size()) || !decode_entry(bytes, secret, key, out))
    return read_outcome::corrupt;
  // The access time eviction goes by: the modification time, which we control (atime is
  // often not updated, noatime/relatime).
  ::futimens(fd.get(), nullptr);
  return read_outcome::hit;
}

bool store_entry(int directory_fd, const std::string& key_hex,
                 const std::vector<unsigned char>& bytes) {
  const std::string temp = make_temp_name(key_hex);
  const std::string final_name = entry_name(key_hex);
  unique_fd fd(::openat(directory_fd, temp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return false;
  // The umask may have taken bits away, never added them: make it exactly 0600.
  const bool written = ::fchmod(fd.get(), 0600) == 0 &&
                       write_all(fd.get(), bytes.data(), bytes.size()) && ::fsync(fd.get()) == 0;
  const bool closed = ::close(fd.release()) == 0;
  if (!written || !closed ||
      ::renameat(directory_fd, temp.c_str(), directory_fd, final_name.c_str()) != 0) {
    ::unlinkat(directory_fd, temp.c_str(), 0);
    return false;
  }
  // Make the rename itself durable.
  ::fsync(directory_fd);
  return true;
}

bool remove_if_same(int directory_fd, const std::string& name, const struct stat& seen) {
  struct stat now {};
  if (::fstatat(directory_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (now.st_dev != seen.st_dev || now.st_ino != seen.st_ino) return false;
  return ::unlinkat(directory_fd, name.c_str(), 0) == 0;
}

void trim_directory(int directory_fd, const std::filesystem::path& directory,
                    std::uint64_t max_bytes, std::atomic<std::uint64_t>& evicted) {
  std::vector<listed_entry> entries = list_entries(directory_fd, directory);
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.size;
  if (total <= max_bytes) return;
  std::sort(entries.begin(), entries.end(), [](const listed_entry& a, const listed_entry& b) {
    return a.used_ns != b.used_ns ? a.used_ns < b.used_ns : a.name < b.name;
  });
  for (const auto& e : entries) {
    if (total <= max_bytes) break;
    if (remove_if_same(directory_fd, e.name, e.seen)) {
      evicted.fetch_add(1);
    }
    // Either removed now, or already gone or replaced by another process (whose new
    // entry the next pass counts).
    total -= e.size;
  }
}

}  // namespace cubridge::compile_cache_internal
