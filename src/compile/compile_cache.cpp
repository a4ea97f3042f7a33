// The on-disk compile cache: key building (with the include scan), the checked directory, the
// entry format with its keyed tag, atomic writes, verified reads and eviction.
// compile_cache.hpp documents the behaviour, docs/compile-cache.md the trust model.
#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/unique_fd.hpp>

#include "detail/ensure_sodium.hpp"

#include <sodium.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cubridge {

namespace fs = std::filesystem;

namespace {

// Bumped whenever the key serialisation or the entry layout changes; part of the key, so
// entries of another format are never even opened.
// v2: the entry's tag is keyed (v1's unkeyed hash could be recomputed by anyone).
constexpr std::string_view key_format = "cubridge compile cache key v2";
constexpr std::array<unsigned char, 8> entry_magic = {'C', 'U', 'B', 'R', 'C', 'C', 'H', 'E'};
constexpr std::uint32_t entry_format_version = 2;
constexpr std::size_t hash_bytes = 32;  // BLAKE2b-256
// magic, version, reserved, payload length, key, tag
constexpr std::size_t entry_header_bytes = 8 + 4 + 4 + 8 + hash_bytes + hash_bytes;
// The part of the header the tag covers: all of it but the tag.
constexpr std::size_t entry_tagged_header_bytes = entry_header_bytes - hash_bytes;
// An entry larger than this is not read (a corrupt length, or not ours).
constexpr std::uint64_t max_entry_bytes = std::uint64_t{1} << 31;
/// The largest file the include scan reads (compile_cache.hpp): far above any real header.
constexpr std::uint64_t max_included_file_bytes = std::uint64_t{256} << 20;
constexpr std::string_view entry_suffix = ".entry";
// ".tmp-cubridge-<64 hex>-<pid>-<counter>-<16 hex>": the only temporary files cleanup removes.
constexpr std::string_view temp_prefix = ".tmp-cubridge-";
// A temporary file this old belongs to a writer that crashed; a live writer needs milliseconds.
constexpr std::time_t stale_temp_seconds = 3600;
// The secret the entries' tags are keyed with, 32 random bytes, mode 0600.
constexpr std::string_view mac_key_name = "cubridge-mac.key";
constexpr std::size_t mac_key_bytes = crypto_generichash_KEYBYTES;
static_assert(mac_key_bytes == 32);

using hash_value = std::array<unsigned char, hash_bytes>;
using mac_key = std::array<unsigned char, mac_key_bytes>;

using detail::ensure_sodium;

/// BLAKE2b-256 over a sequence of tagged, length-prefixed fields: unambiguous, so two different
/// inputs never serialise to the same bytes.
class hasher {
 public:
  hasher() {
    ensure_sodium();
    crypto_generichash_init(&state_, nullptr, 0, hash_bytes);
  }
  void raw(const void* data, std::size_t size) {
    crypto_generichash_update(&state_, static_cast<const unsigned char*>(data), size);
  }
  void length(std::uint64_t n) {
    std::array<unsigned char, 8> le{};
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
    raw(le.data(), le.size());
  }
  void field(std::string_view tag, std::string_view value) {
    length(tag.size());
    raw(tag.data(), tag.size());
    length(value.size());
    raw(value.data(), value.size());
  }
  hash_value finish() {
    hash_value out{};
    crypto_generichash_final(&state_, out.data(), out.size());
    return out;
  }

 private:
  crypto_generichash_state state_{};
};

/// The entry's tag: BLAKE2b-256 keyed with the cache's secret over the header (all but the
/// tag: magic, version, length and the key it is stored under) and the payload. Without the
/// secret nobody can make an entry this cache accepts, whatever else they can write.
hash_value entry_tag(const mac_key& secret, const unsigned char* header,
                     const unsigned char* payload, std::size_t payload_size) {
  ensure_sodium();
  crypto_generichash_state state{};
  crypto_generichash_init(&state, secret.data(), secret.size(), hash_bytes);
  crypto_generichash_update(&state, header, entry_tagged_header_bytes);
  crypto_generichash_update(&state, payload, payload_size);
  hash_value out{};
  crypto_generichash_final(&state, out.data(), out.size());
  return out;
}

using detail::to_hex;

std::string version_text(library_version v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

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

/// A fresh temporary name of the cache's own pattern; `tag_hex` is the key of the entry it will
/// become (64 hex digits).
std::string make_temp_name(std::string_view tag_hex) {
  static std::atomic<std::uint64_t> counter{0};
  ensure_sodium();
  std::array<unsigned char, 8> random{};
  randombytes_buf(random.data(), random.size());
  const std::string suffix = detail::to_hex(random);
  return std::string(temp_prefix) + std::string(tag_hex) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + suffix;
}

// ---- ownership and permission checks ----------------------------------------------------------

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

/// "a directory owned by uid 1000, mode 0777", from what fstat found.
std::string describe(const struct stat& info) {
  const char* kind = S_ISDIR(info.st_mode)    ? "a directory"
                     : S_ISREG(info.st_mode)  ? "a regular file"
                     : S_ISLNK(info.st_mode)  ? "a symbolic link"
                     : S_ISFIFO(info.st_mode) ? "a FIFO"
                                              : "a special file";
  return std::string(kind) + " owned by uid " + std::to_string(info.st_uid) + ", mode " +
         octal_mode(info.st_mode);
}

/// Throws cubridge::error (errc::io): "refusing <which>: found <found>; required: <required>".
[[noreturn]] void refuse(const std::string& which, const std::string& found,
                         const std::string& required) {
  detail::throw_errc(errc::io, "compile_cache::open",
                     "refusing " + which + ": found " + found + "; required: " + required);
}

constexpr mode_t written_by_others = S_IWGRP | S_IWOTH;

/// The cache directory: the effective user's, and only theirs to write.
bool safe_cache_directory(const struct stat& info) {
  return S_ISDIR(info.st_mode) && info.st_uid == ::geteuid() &&
         (info.st_mode & written_by_others) == 0;
}

/// A directory above the cache: nobody but root and the user can rename what is in it (a
/// sticky directory such as /tmp lets others remove only their own names).
bool safe_ancestor(const struct stat& info) {
  return S_ISDIR(info.st_mode) && (info.st_uid == 0 || info.st_uid == ::geteuid()) &&
         ((info.st_mode & written_by_others) == 0 || (info.st_mode & S_ISVTX) != 0);
}

/// A file the cache reads (an entry): a regular file of the user's, writable only by them.
bool safe_file(const struct stat& info) {
  return S_ISREG(info.st_mode) && info.st_uid == ::geteuid() &&
         (info.st_mode & written_by_others) == 0;
}

/// Opens `directory` (creating what is missing, mode 0700) one component at a time from "/",
/// never following a link, checking each directory through the descriptor it opened: what is
/// checked is what is used. Links in the given path are resolved first (so $HOME may be one);
/// the resolved path is what is checked. Throws cubridge::error (errc::io) naming the path.
unique_fd open_cache_directory(const fs::path& directory) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(directory, ec);
  fs::path resolved = ec ? fs::path() : fs::weakly_canonical(absolute, ec);
  if (ec)
    detail::throw_errc(errc::io, "compile_cache::open",
                       "opening compile cache '" + directory.string() + "': " + ec.message());
  const uid_t user = ::geteuid();
  const std::string user_text = "uid " + std::to_string(user) + " (the effective user)";
  const std::string cache_required =
      "a directory owned by " + user_text + " and not writable by group or others (chmod 700)";
  const std::string cache_which = "compile cache '" + directory.string() + "'";
  auto ancestor_which = [&directory](const fs::path& path) {
    return "'" + path.string() + "', a directory above compile cache '" + directory.string() + "'";
  };
  const std::string ancestor_required =
      "every directory above the cache owned by root or " + user_text +
      " and not writable by group or others unless sticky (as /tmp is)";

  unique_fd current(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  fs::path at = resolved.root_path();
  std::vector<std::string> parts;
  for (const auto& part : resolved.relative_path())
    if (!part.empty() && part != ".") parts.push_back(part.string());
  auto fail = [&](const fs::path& path, const std::string& what) -> void {
    detail::throw_errc(
        errc::io, "compile_cache::open",
        "opening compile cache '" + directory.string() + "': '" + path.string() + "' " + what);
  };
  if (!current) fail(at, std::string("cannot be opened: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(current.get(), &info) != 0) fail(at, std::strerror(errno));
  if (parts.empty()) {
    if (!safe_cache_directory(info)) refuse(cache_which, describe(info), cache_required);
    return current;
  }
  if (!safe_ancestor(info)) refuse(ancestor_which(at), describe(info), ancestor_required);

  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const std::string& name = parts[i];
    at /= name;
    constexpr int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    unique_fd next(::openat(current.get(), name.c_str(), flags));
    bool created = false;
    if (!next && errno == ENOENT) {
      if (::mkdirat(current.get(), name.c_str(), 0700) == 0) {
        created = true;
      } else if (errno != EEXIST) {  // EEXIST: another process made it meanwhile
        fail(at, std::string("cannot be created: ") + std::strerror(errno));
      }
      next.reset(::openat(current.get(), name.c_str(), flags));
    }
    if (!next) {
      const int saved = errno;
      struct stat link {};
      if (::fstatat(current.get(), name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 &&
          !S_ISDIR(link.st_mode)) {
        // Not a directory, or a link that appeared after the path was resolved.
        if (last) refuse(cache_which, describe(link), cache_required);
        refuse(ancestor_which(at), describe(link), ancestor_required);
      }
      fail(at, std::string("cannot be opened: ") + std::strerror(saved));
    }
    if (::fstat(next.get(), &info) != 0) fail(at, std::strerror(errno));
    // The umask may have taken bits away: a directory made here is exactly 0700.
    if (created && info.st_uid == user && (info.st_mode & 07777) != 0700) {
      if (::fchmod(next.get(), 0700) != 0) fail(at, std::string("chmod: ") + std::strerror(errno));
      info.st_mode = (info.st_mode & ~mode_t{07777}) | 0700;
    }
    if (last) {
      if (!safe_cache_directory(info)) refuse(cache_which, describe(info), cache_required);
    } else if (!safe_ancestor(info)) {
      refuse(ancestor_which(at), describe(info), ancestor_required);
    }
    current = std::move(next);
  }
  return current;
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

/// Reads exactly `size` bytes; false on a short read or an error.
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

/// The secret in `directory_fd`, made on first use: written to a temporary file (O_EXCL, mode
/// 0600) and linked to its name, which fails if it exists, so two processes starting together
/// agree on one key and nobody reads a half-written one. A key that is not a regular 32-byte
/// file of the user's that only they can read or write is refused, not replaced.
mac_key load_or_create_mac_key(int directory_fd, const fs::path& directory) {
  const fs::path key_path = directory / mac_key_name;
  const std::string which =
      "'" + key_path.string() + "', the key of compile cache '" + directory.string() + "'";
  const std::string required = "a regular file of " + std::to_string(mac_key_bytes) +
                               " bytes owned by uid " + std::to_string(::geteuid()) +
                               " with mode 0600 (remove it to make a new key: every entry is "
                               "then compiled again)";
  auto fail = [&](const std::string& what) {
    detail::throw_errc(errc::io, "compile_cache::open",
                       "compile cache key '" + key_path.string() + "': " + what);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    unique_fd fd(::openat(directory_fd, mac_key_name.data(),
                          O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (fd) {
      struct stat info {};
      if (::fstat(fd.get(), &info) != 0) fail(std::strerror(errno));
      if (!S_ISREG(info.st_mode) || info.st_uid != ::geteuid() || (info.st_mode & 077) != 0 ||
          info.st_size != static_cast<off_t>(mac_key_bytes))
        refuse(which, describe(info) + ", " + std::to_string(info.st_size) + " bytes", required);
      mac_key key{};
      if (!read_all(fd.get(), key.data(), key.size())) fail("short read");
      return key;
    }
    if (errno != ENOENT) {
      const int saved = errno;
      struct stat info {};
      if (::fstatat(directory_fd, mac_key_name.data(), &info, AT_SYMLINK_NOFOLLOW) == 0)
        refuse(which, describe(info), required);
      fail(std::string("cannot be opened: ") + std::strerror(saved));
    }
    // None yet: make one. The temporary name's tag is all zeros (it is no entry's key).
    const std::string temp = make_temp_name(std::string(64, '0'));
    unique_fd out(::openat(directory_fd, temp.c_str(),
                           O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) fail(std::string("cannot be created: ") + std::strerror(errno));
    mac_key key{};
    randombytes_buf(key.data(), key.size());
    const bool written = ::fchmod(out.get(), 0600) == 0 &&
                         write_all(out.get(), key.data(), key.size()) && ::fsync(out.get()) == 0;
    sodium_memzero(key.data(), key.size());
    out.reset();
    const int linked =
        written ? ::linkat(directory_fd, temp.c_str(), directory_fd, mac_key_name.data(), 0) : -1;
    const int saved = errno;
    ::unlinkat(directory_fd, temp.c_str(), 0);
    if (!written) fail("cannot be written: " + std::string(std::strerror(saved)));
    if (linked != 0 && saved != EEXIST)  // EEXIST: another process made one first; use it
      fail(std::string("cannot be created: ") + std::strerror(saved));
    ::fsync(directory_fd);
  }
  fail("vanished while being created");
  return {};
}

// ---- the include scan ----------------------------------------------------------------------

struct include_directive {
  std::string name;
  bool quoted = false;
};

/// The `#include "x"` / `#include <x>` (and #include_next) directives of `text`, line by line.
/// `#include MACRO` is not resolved; `#if` is not evaluated (so this may find too many).
std::vector<include_directive> find_includes(std::string_view text) {
  std::vector<include_directive> found;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    auto skip_blanks = [&line] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    };
    skip_blanks();
    if (line.empty() || line.front() != '#') continue;
    line.remove_prefix(1);
    skip_blanks();
    if (line.starts_with("include_next")) {
      line.remove_prefix(12);
    } else if (line.starts_with("include")) {
      line.remove_prefix(7);
    } else {
      continue;
    }
    skip_blanks();
    if (line.empty()) continue;
    const char open = line.front();
    if (open != '"' && open != '<') continue;
    const char close = open == '"' ? '"' : '>';
    const std::size_t stop = line.find(close, 1);
    if (stop == std::string_view::npos || stop == 1) continue;
    found.push_back({std::string(line.substr(1, stop - 1)), open == '"'});
  }
  return found;
}

/// The content of an included file: a regular file of at most max_included_file_bytes, opened
/// without blocking (detail::read_regular_file), so a file swapped for a FIFO after the scan
/// checked it is refused instead of hanging the lookup.
std::string read_whole_file(const fs::path& path) {
  const auto bytes = detail::read_regular_file(path, max_included_file_bytes, "included file");
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

fs::path directory_of(std::string_view name) {
  const fs::path parent = fs::path(name).parent_path();
  return fs::absolute(parent.empty() ? fs::path(".") : parent).lexically_normal();
}

/// Every file on disk that the source, its in-memory headers and the files they include may
/// read: absolute path -> content. See compile_cache.hpp for what it looks at.
std::map<std::string, std::string> scan_includes(const cuda_source& source,
                                                 const compile_options& options) {
  std::vector<fs::path> search;
  for (const auto& path : options.include_paths) search.push_back(path);
  std::vector<std::string> pre_includes;
  for (std::string_view option : options.extra_options) {
    if (option.starts_with("--include-path=")) {
      search.emplace_back(option.substr(15));
    } else if (option.starts_with("-I")) {
      option.remove_prefix(2);
      if (option.starts_with("=")) option.remove_prefix(1);
      search.emplace_back(option);
    } else if (option.starts_with("--pre-include=")) {
      pre_includes.emplace_back(option.substr(14));
    } else if (option.starts_with("-include")) {
      option.remove_prefix(8);
      if (option.starts_with("=")) option.remove_prefix(1);
      pre_includes.emplace_back(option);
    }
  }

  struct pending {
    std::string text;
    fs::path directory;
  };
  std::deque<pending> work;
  const fs::path source_directory = directory_of(source.name);
  work.push_back({source.text, source_directory});
  for (const auto& header : options.headers)
    work.push_back({header.content, directory_of(header.name)});
  {
    std::string pre;
    for (const auto& name : pre_includes) pre += "#include \"" + name + "\"\n";
    if (!pre.empty()) work.push_back({std::move(pre), source_directory});
  }

  std::map<std::string, std::string> files;
  while (!work.empty()) {
    const pending item = std::move(work.front());
    work.pop_front();
    for (const auto& directive : find_includes(item.text)) {
      std::vector<fs::path> candidates;
      const fs::path spelled(directive.name);
      if (spelled.is_absolute()) {
        candidates.push_back(spelled);
      } else {
        if (directive.quoted) candidates.push_back(item.directory / spelled);
        for (const auto& directory : search) candidates.push_back(directory / spelled);
      }
      for (const auto& candidate : candidates) {
        std::error_code ec;
        if (!fs::is_regular_file(candidate, ec)) continue;
        std::string path = fs::absolute(candidate).lexically_normal().string();
        if (files.contains(path)) continue;
        std::string content = read_whole_file(path);
        work.push_back({content, fs::path(path).parent_path()});
        files.emplace(std::move(path), std::move(content));
      }
    }
  }
  return files;
}

// ---- the entry format ----------------------------------------------------------------------

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u64(std::vector<unsigned char>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_bytes(std::vector<unsigned char>& out, const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  out.insert(out.end(), p, p + size);
}
void put_string(std::vector<unsigned char>& out, std::string_view s) {
  put_u64(out, s.size());
  put_bytes(out, s.data(), s.size());
}

std::vector<unsigned char> encode_entry(const mac_key& secret, const hash_value& key,
                                        const compiled_image& image) {
  std::vector<unsigned char> payload;
  put_u64(payload, image.cubin.size());
  put_bytes(payload, image.cubin.data(), image.cubin.size());
  put_u64(payload, image.lowered_names.size());
  for (const auto& [expression, lowered] : image.lowered_names) {
    put_string(payload, expression);
    put_string(payload, lowered);
  }
  put_string(payload, image.log);

  std::vector<unsigned char> entry;
  entry.reserve(entry_header_bytes + payload.size());
  put_bytes(entry, entry_magic.data(), entry_magic.size());
  put_u32(entry, entry_format_version);
  put_u32(entry, 0);
  put_u64(entry, payload.size());
  put_bytes(entry, key.data(), key.size());
  const hash_value tag = entry_tag(secret, entry.data(), payload.data(), payload.size());
  put_bytes(entry, tag.data(), tag.size());
  put_bytes(entry, payload.data(), payload.size());
  return entry;
}

/// Bounds-checked little-endian reading; any overrun clears ok.
struct byte_reader {
  const unsigned char* data;
  std::size_t left;
  bool ok = true;

  bool take(void* out, std::size_t n) {
    if (!ok || n > left) return ok = false;
    if (n) std::memcpy(out, data, n);
    data += n;
    left -= n;
    return true;
  }
  std::uint64_t u64() {
    unsigned char b[8] = {};
    if (!take(b, 8)) return 0;
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::uint32_t u32() {
    unsigned char b[4] = {};
    if (!take(b, 4)) return 0;
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::string string() {
    const std::uint64_t n = u64();
    if (!ok || n > left) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    data += n;
    left -= n;
    return s;
  }
};

/// hit: served. absent: no entry. corrupt: a file of ours that is not a valid entry for the key
/// (truncated, damaged, another key, another format or another secret). refused: not a file the
/// cache trusts itself to read (a link, a FIFO, another user's, writable by others).
enum class read_outcome { hit, absent, corrupt, refused };

/// Decodes a whole entry file; false if anything is off, the tag first of all.
bool decode_entry(const std::vector<unsigned char>& bytes, const mac_key& secret,
                  const hash_value& key, compiled_image& out) {
  if (bytes.size() < entry_header_bytes) return false;
  byte_reader header{bytes.data(), entry_header_bytes};
  std::array<unsigned char, 8> magic{};
  header.take(magic.data(), magic.size());
  const std::uint32_t version = header.u32();
  header.u32();  // reserved
  const std::uint64_t payload_size = header.u64();
  hash_value stored_key{};
  hash_value stored_tag{};
  header.take(stored_key.data(), stored_key.size());
  header.take(stored_tag.data(), stored_tag.size());
  if (!header.ok || magic != entry_magic || version != entry_format_version || stored_key != key ||
      payload_size != bytes.size() - entry_header_bytes)
    return false;
  const unsigned char* payload = bytes.data() + entry_header_bytes;
  const hash_value tag = entry_tag(secret, bytes.data(), payload, payload_size);
  if (sodium_memcmp(tag.data(), stored_tag.data(), tag.size()) != 0) return false;

  byte_reader reader{payload, static_cast<std::size_t>(payload_size)};
  const std::uint64_t cubin_size = reader.u64();
  if (!reader.ok || cubin_size > reader.left) return false;
  out.cubin.resize(static_cast<std::size_t>(cubin_size));
  reader.take(out.cubin.data(), out.cubin.size());
  const std::uint64_t names = reader.u64();
  // Each name takes at least 16 bytes of lengths: a corrupt count cannot make us loop long.
  if (!reader.ok || names > reader.left / 16) return false;
  out.lowered_names.clear();
  for (std::uint64_t i = 0; i < names && reader.ok; ++i) {
    std::string expression = reader.string();
    std::string lowered = reader.string();
    out.lowered_names.emplace(std::move(expression), std::move(lowered));
  }
  out.log = reader.string();
  return reader.ok && reader.left == 0;
}

/// Reads entry `name` in `directory_fd`. Only a regular file of the user's that only they may
/// write is opened at all (checked before opening, so a FIFO or device is never opened, and
/// again on the descriptor, so a swap in between is caught); O_NONBLOCK so nothing can block.
/// `found` gets what was looked at, for the caller's decision to remove it.
read_outcome read_entry(int directory_fd, const std::string& name, const mac_key& secret,
                        const hash_value& key, compiled_image& out, struct stat& found) {
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

/// Writes the entry to a temporary file in the directory (O_EXCL, O_NOFOLLOW, mode 0600),
/// flushes it to disk and renames it into place, so the final name only ever holds a complete
/// entry. Whatever had the final name (a damaged entry, a link) is replaced, never written
/// through.
bool store_entry(int directory_fd, const std::string& key_hex,
                 const std::vector<unsigned char>& bytes) {
  const std::string temp = make_temp_name(key_hex);
  const std::string final_name = key_hex + std::string(entry_suffix);
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

/// Removes `name` only while it is still the file `seen` (same device and inode): another
/// process of the user's may have renamed a good entry there since.
bool remove_if_same(int directory_fd, const std::string& name, const struct stat& seen) {
  struct stat now {};
  if (::fstatat(directory_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (now.st_dev != seen.st_dev || now.st_ino != seen.st_ino) return false;
  return ::unlinkat(directory_fd, name.c_str(), 0) == 0;
}

}  // namespace

// ---- compile_cache -----------------------------------------------------------------------------

struct compile_cache::state {
  fs::path directory;
  // Everything is opened relative to this descriptor of the checked directory, never by path:
  // renaming or replacing the path after open() changes nothing.
  unique_fd directory_fd;
  mac_key secret{};
  std::uint64_t max_bytes = 0;
  std::string nvrtc;
  std::string nvjitlink;

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> corrupt_dropped{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> evicted{0};
  std::atomic<std::uint64_t> store_failures{0};

  state() = default;
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() { sodium_memzero(secret.data(), secret.size()); }

  // Keys being compiled by some thread of this cache; others wait for that result.
  std::mutex in_flight_mutex;
  std::unordered_map<std::string, std::shared_future<compiled_image>> in_flight;
  // One trim at a time in this process (across processes a race only removes a file twice).
  std::mutex trim_mutex;

  fs::path entry_path(const std::string& key_hex) const {
    return directory / (key_hex + std::string(entry_suffix));
  }

  /// Reads the entry; drops it if it is a corrupt file of ours, skips it if it is refused
  /// (counted once per lookup: `refusal_counted` carries that from the first read).
  bool try_read(const hash_value& key, const std::string& key_hex, compiled_image& out,
                bool& refusal_counted) {
    const std::string name = key_hex + std::string(entry_suffix);
    struct stat found {};
    switch (read_entry(directory_fd.get(), name, secret, key, out, found)) {
      case read_outcome::hit:
        return true;
      case read_outcome::absent:
        return false;
      case read_outcome::corrupt:
        if (remove_if_same(directory_fd.get(), name, found)) corrupt_dropped.fetch_add(1);
        return false;
      case read_outcome::refused:
        if (!refusal_counted) refused.fetch_add(1);
        refusal_counted = true;
        // Ours but writable by others: its content cannot be trusted, and it is ours to
        // remove. Anything else (a link, a FIFO, another user's file) is left alone; the
        // store renames a new entry over the name.
        if (S_ISREG(found.st_mode) && found.st_uid == ::geteuid())
          remove_if_same(directory_fd.get(), name, found);
        return false;
    }
    return false;
  }

  compiled_image get_or_make(const hash_value& key, const std::function<compiled_image()>& make) {
    const std::string key_hex = to_hex(key);
    compiled_image image;
    bool refusal_counted = false;
    if (try_read(key, key_hex, image, refusal_counted)) {
      hits.fetch_add(1);
      return image;
    }
    std::promise<compiled_image> promise;
    {
      std::unique_lock lock(in_flight_mutex);
      if (auto it = in_flight.find(key_hex); it != in_flight.end()) {
        std::shared_future<compiled_image> pending = it->second;
        lock.unlock();
        image = pending.get();  // rethrows the compile's exception
        hits.fetch_add(1);
        return image;
      }
      in_flight.emplace(key_hex, promise.get_future().share());
    }
    auto finish = [&](auto&& set) {
      set();
      std::lock_guard lock(in_flight_mutex);
      in_flight.erase(key_hex);
    };
    try {
      // A thread that held the key until just now may have stored it.
      if (try_read(key, key_hex, image, refusal_counted)) {
        hits.fetch_add(1);
      } else {
        image = make();
        misses.fetch_add(1);
        if (store_entry(directory_fd.get(), key_hex, encode_entry(secret, key, image))) {
          trim_quietly();
        } else {
          store_failures.fetch_add(1);
        }
      }
    } catch (...) {
      finish([&] { promise.set_exception(std::current_exception()); });
      throw;
    }
    finish([&] { promise.set_value(image); });
    return image;
  }

  void trim_quietly() noexcept {
    try {
      trim();
    } catch (...) {
      // A failed eviction pass only leaves the directory over its limit until the next one.
    }
  }

  /// Evicts and cleans up, touching only the cache's own files: "<64 hex>.entry" and
  /// ".tmp-cubridge-..." names that are regular files of the user's. Everything else in the
  /// directory (other names, links, FIFOs, directories, other users' files) is left alone.
  void trim() {
    std::lock_guard lock(trim_mutex);
    struct entry {
      std::int64_t used_ns;
      std::uint64_t size;
      std::string name;
      struct stat seen;
    };
    std::vector<entry> entries;
    std::uint64_t total = 0;
    const std::time_t now = std::time(nullptr);
    // A descriptor of its own for the listing: readdir moves the offset of the one it reads.
    unique_fd listing(::openat(directory_fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
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
      if (::fstatat(directory_fd.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (!S_ISREG(info.st_mode) || info.st_uid != user) continue;
      if (!is_entry) {
        if (now - info.st_mtim.tv_sec > stale_temp_seconds)
          remove_if_same(directory_fd.get(), name, info);
        continue;
      }
      const std::int64_t used_ns =
          std::int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
      entries.push_back({used_ns, static_cast<std::uint64_t>(info.st_size), name, info});
      total += static_cast<std::uint64_t>(info.st_size);
    }
    if (total <= max_bytes) return;
    std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
      return a.used_ns != b.used_ns ? a.used_ns < b.used_ns : a.name < b.name;
    });
    for (const auto& e : entries) {
      if (total <= max_bytes) break;
      if (remove_if_same(directory_fd.get(), e.name, e.seen)) {
        evicted.fetch_add(1);
      }
      // Either removed now, or already gone or replaced by another process (whose new
      // entry the next pass counts).
      total -= e.size;
    }
  }

  hash_value key_of(const cuda_source& source, const compile_options& options) const {
    const auto files = scan_includes(source, options);
    hasher h;
    h.field("format", key_format);
    h.field("kind", "nvrtc cubin");
    h.field("nvrtc", nvrtc);
    h.field("nvjitlink", nvjitlink);
    h.field("architecture", options.architecture);
    h.field("source name", source.name);
    h.field("source", source.text);
    std::vector<const source_header*> headers;
    for (const auto& header : options.headers) headers.push_back(&header);
    std::sort(headers.begin(), headers.end(),
              [](const source_header* a, const source_header* b) { return a->name < b->name; });
    for (const auto* header : headers) {
      h.field("header name", header->name);
      h.field("header content", header->content);
    }
    for (const auto& path : options.include_paths) h.field("include path", path.string());
    for (const auto& [name, value] : options.defines) {
      h.field("define name", name);
      h.field("define value", value);
    }
    const std::set<std::string> expressions(options.name_expressions.begin(),
                                            options.name_expressions.end());
    for (const auto& expression : expressions) h.field("name expression", expression);
    for (const auto& option : options.extra_options) h.field("option", option);
    for (const auto& [path, content] : files) {
      h.field("file path", path);
      h.field("file content", content);
    }
    return h.finish();
  }

  hash_value key_of(std::string_view ptx, const ptx_link_options& options) const {
    hasher h;
    h.field("format", key_format);
    h.field("kind", "ptx cubin");
    h.field("nvrtc", nvrtc);
    h.field("nvjitlink", nvjitlink);
    h.field("architecture", options.architecture);
    h.field("source name", options.name);
    h.field("ptx", ptx);
    for (const auto& option : options.extra_options) h.field("option", option);
    return h.finish();
  }
};

compile_cache::compile_cache(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}
compile_cache::compile_cache(compile_cache&&) noexcept = default;
compile_cache& compile_cache::operator=(compile_cache&&) noexcept = default;
compile_cache::~compile_cache() = default;

fs::path compile_cache::default_directory() {
  auto variable = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? std::string(value) : std::string();
  };
  if (auto dir = variable("CUBRIDGE_CACHE_DIR"); !dir.empty()) return dir;
  if (auto xdg = variable("XDG_CACHE_HOME"); !xdg.empty() && fs::path(xdg).is_absolute())
    return fs::path(xdg) / "cubridge";
  if (auto home = variable("HOME"); !home.empty()) return fs::path(home) / ".cache" / "cubridge";
  detail::throw_errc(errc::io, "compile_cache::default_directory",
                     "no cache directory: set CUBRIDGE_CACHE_DIR, XDG_CACHE_HOME or HOME");
}

compile_cache compile_cache::open(const fs::path& directory, std::uint64_t max_bytes) {
  CUBRIDGE_EXPECTS(max_bytes > 0, "opening compile cache '" + directory.string() + "'");
  auto s = std::make_unique<state>();
  s->directory = directory;
  s->directory_fd = open_cache_directory(directory);
  s->secret = load_or_create_mac_key(s->directory_fd.get(), directory);
  s->max_bytes = max_bytes;
  s->nvrtc = version_text(nvrtc_version());
  s->nvjitlink = version_text(nvjitlink_version());
  s->trim();
  return compile_cache(std::move(s));
}

compile_cache compile_cache::open_default(std::uint64_t max_bytes) {
  return open(default_directory(), max_bytes);
}

compiled_image compile_cache::get_or_compile(const cuda_source& source,
                                             const compile_options& options) {
  return state_->get_or_make(state_->key_of(source, options),
                             [&] { return nvrtc_compile(source, options); });
}

compiled_image compile_cache::get_or_link(std::string_view ptx, const ptx_link_options& options) {
  return state_->get_or_make(state_->key_of(ptx, options),
                             [&] { return ptx_to_cubin(ptx, options); });
}

std::string compile_cache::key_for(const cuda_source& source,
                                   const compile_options& options) const {
  return to_hex(state_->key_of(source, options));
}

std::string compile_cache::key_for(std::string_view ptx, const ptx_link_options& options) const {
  return to_hex(state_->key_of(ptx, options));
}

fs::path compile_cache::entry_path(std::string_view key) const {
  return state_->entry_path(std::string(key));
}

fs::path compile_cache::key_path() const {
  return state_->directory / mac_key_name;
}

const fs::path& compile_cache::directory() const noexcept {
  return state_->directory;
}

std::uint64_t compile_cache::max_bytes() const noexcept {
  return state_->max_bytes;
}

compile_cache_stats compile_cache::stats() const noexcept {
  return {.hits = state_->hits.load(),
          .misses = state_->misses.load(),
          .corrupt_dropped = state_->corrupt_dropped.load(),
          .refused = state_->refused.load(),
          .evicted = state_->evicted.load(),
          .store_failures = state_->store_failures.load()};
}

void compile_cache::trim() {
  state_->trim();
}

}  // namespace cubridge
