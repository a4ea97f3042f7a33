// The on-disk compile cache: key building (with the include scan), the entry format, atomic
// writes, verified reads and eviction. compile_cache.hpp documents the behaviour.
#include <cubridge/compile_cache.hpp>

#include <sodium.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
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
constexpr std::string_view key_format = "cubridge compile cache key v1";
constexpr std::array<unsigned char, 8> entry_magic = {'C', 'U', 'B', 'R', 'C', 'C', 'H', 'E'};
constexpr std::uint32_t entry_format_version = 1;
constexpr std::size_t hash_bytes = 32;  // BLAKE2b-256
// magic, version, reserved, payload length, key, payload hash
constexpr std::size_t entry_header_bytes = 8 + 4 + 4 + 8 + hash_bytes + hash_bytes;
// An entry larger than this is not read (a corrupt length, or not ours).
constexpr std::uint64_t max_entry_bytes = std::uint64_t{1} << 31;
constexpr std::string_view entry_suffix = ".entry";
constexpr std::string_view temp_prefix = ".tmp-";
// A temporary file this old belongs to a writer that crashed; a live writer needs milliseconds.
constexpr auto stale_temp_age = std::chrono::hours(1);

using hash_value = std::array<unsigned char, hash_bytes>;

void ensure_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) detail::throw_errc(errc::precondition, "sodium_init", "libsodium failed to start");
}

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

hash_value hash_bytes_of(const unsigned char* data, std::size_t size) {
  ensure_sodium();
  hash_value out{};
  crypto_generichash(out.data(), out.size(), data, size, nullptr, 0);
  return out;
}

std::string to_hex(const hash_value& value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(value.size() * 2);
  for (unsigned char byte : value) {
    hex += digits[byte >> 4];
    hex += digits[byte & 15];
  }
  return hex;
}

std::string version_text(library_version v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
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

std::string read_whole_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    detail::throw_errc(errc::io, "open",
                       "reading included file '" + path.string() + "': " + std::strerror(errno));
  std::string content;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      detail::throw_errc(errc::io, "read",
                         "reading included file '" + path.string() + "': " + std::strerror(saved));
    }
    content.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return content;
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

std::vector<unsigned char> encode_entry(const hash_value& key, const compiled_image& image) {
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
  const hash_value payload_hash = hash_bytes_of(payload.data(), payload.size());
  put_bytes(entry, payload_hash.data(), payload_hash.size());
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

enum class read_outcome { hit, absent, corrupt };

/// Decodes a whole entry file; false if anything is off.
bool decode_entry(const std::vector<unsigned char>& bytes, const hash_value& key,
                  compiled_image& out) {
  if (bytes.size() < entry_header_bytes) return false;
  byte_reader header{bytes.data(), entry_header_bytes};
  std::array<unsigned char, 8> magic{};
  header.take(magic.data(), magic.size());
  const std::uint32_t version = header.u32();
  header.u32();  // reserved
  const std::uint64_t payload_size = header.u64();
  hash_value stored_key{};
  hash_value stored_hash{};
  header.take(stored_key.data(), stored_key.size());
  header.take(stored_hash.data(), stored_hash.size());
  if (!header.ok || magic != entry_magic || version != entry_format_version || stored_key != key ||
      payload_size != bytes.size() - entry_header_bytes)
    return false;
  const unsigned char* payload = bytes.data() + entry_header_bytes;
  if (hash_bytes_of(payload, payload_size) != stored_hash) return false;

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

read_outcome read_entry(const fs::path& path, const hash_value& key, compiled_image& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return read_outcome::absent;  // missing, or unreadable: compile instead
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    return read_outcome::absent;
  }
  if (info.st_size < 0 || static_cast<std::uint64_t>(info.st_size) < entry_header_bytes ||
      static_cast<std::uint64_t>(info.st_size) > max_entry_bytes) {
    ::close(fd);
    return read_outcome::corrupt;
  }
  std::vector<unsigned char> bytes(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  if (done != bytes.size() || !decode_entry(bytes, key, out)) {
    ::close(fd);
    return read_outcome::corrupt;
  }
  // The access time eviction goes by: the modification time, which we control (atime is
  // often not updated, noatime/relatime).
  ::futimens(fd, nullptr);
  ::close(fd);
  return read_outcome::hit;
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

/// Writes the entry to a temporary file in the same directory, flushes it to disk and renames
/// it into place, so the final name only ever holds a complete entry.
bool store_entry(const fs::path& directory, const std::string& key_hex,
                 const std::vector<unsigned char>& bytes) {
  static std::atomic<std::uint64_t> counter{0};
  ensure_sodium();
  std::array<unsigned char, 8> random{};
  randombytes_buf(random.data(), random.size());
  std::string suffix;
  for (unsigned char byte : random) suffix += "0123456789abcdef"[byte & 15];
  const fs::path temp =
      directory / (std::string(temp_prefix) + key_hex + "-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter.fetch_add(1)) + "-" + suffix);
  const fs::path final_path = directory / (key_hex + std::string(entry_suffix));

  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool written = write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!written || !closed || ::rename(temp.c_str(), final_path.c_str()) != 0) {
    ::unlink(temp.c_str());
    return false;
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return true;
}

}  // namespace

// ---- compile_cache -----------------------------------------------------------------------------

struct compile_cache::state {
  fs::path directory;
  std::uint64_t max_bytes = 0;
  std::string nvrtc;
  std::string nvjitlink;

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> corrupt_dropped{0};
  std::atomic<std::uint64_t> evicted{0};
  std::atomic<std::uint64_t> store_failures{0};

  // Keys being compiled by some thread of this cache; others wait for that result.
  std::mutex in_flight_mutex;
  std::unordered_map<std::string, std::shared_future<compiled_image>> in_flight;
  // One trim at a time in this process (across processes a race only removes a file twice).
  std::mutex trim_mutex;

  fs::path entry_path(const std::string& key_hex) const {
    return directory / (key_hex + std::string(entry_suffix));
  }

  /// Reads the entry; drops it if it is corrupt.
  bool try_read(const hash_value& key, const std::string& key_hex, compiled_image& out) {
    const fs::path path = entry_path(key_hex);
    switch (read_entry(path, key, out)) {
      case read_outcome::hit:
        return true;
      case read_outcome::absent:
        return false;
      case read_outcome::corrupt:
        // Another process may have renamed a good entry here since we read: then we lose
        // that entry, never serve a bad one.
        if (::unlink(path.c_str()) == 0) corrupt_dropped.fetch_add(1);
        return false;
    }
    return false;
  }

  compiled_image get_or_make(const hash_value& key, const std::function<compiled_image()>& make) {
    const std::string key_hex = to_hex(key);
    compiled_image image;
    if (try_read(key, key_hex, image)) {
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
      if (try_read(key, key_hex, image)) {
        hits.fetch_add(1);
      } else {
        image = make();
        misses.fetch_add(1);
        if (store_entry(directory, key_hex, encode_entry(key, image))) {
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

  void trim() {
    std::lock_guard lock(trim_mutex);
    struct entry {
      fs::file_time_type used;
      std::uint64_t size;
      fs::path path;
    };
    std::vector<entry> entries;
    std::uint64_t total = 0;
    const auto now = fs::file_time_type::clock::now();
    std::error_code ec;
    fs::directory_iterator it(directory, ec);
    if (ec)
      detail::throw_errc(errc::io, "directory_iterator",
                         "listing compile cache '" + directory.string() + "': " + ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) break;
      const std::string name = it->path().filename().string();
      std::error_code entry_ec;
      const auto time = it->last_write_time(entry_ec);
      if (entry_ec) continue;
      if (name.starts_with(temp_prefix)) {
        if (now - time > stale_temp_age) fs::remove(it->path(), entry_ec);
        continue;
      }
      if (!name.ends_with(entry_suffix) || !it->is_regular_file(entry_ec)) continue;
      const std::uint64_t size = it->file_size(entry_ec);
      if (entry_ec) continue;
      entries.push_back({time, size, it->path()});
      total += size;
    }
    if (total <= max_bytes) return;
    std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
      return a.used != b.used ? a.used < b.used : a.path < b.path;
    });
    for (const auto& e : entries) {
      if (total <= max_bytes) break;
      std::error_code remove_ec;
      if (fs::remove(e.path, remove_ec)) {
        evicted.fetch_add(1);
        total -= e.size;
      } else if (!fs::exists(e.path, remove_ec)) {
        total -= e.size;  // another process removed it first
      }
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
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec || !fs::is_directory(directory, ec))
    detail::throw_errc(errc::io, "create_directories",
                       "opening compile cache '" + directory.string() +
                           "': " + (ec ? ec.message() : std::string("not a directory")));
  auto s = std::make_unique<state>();
  s->directory = directory;
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

const fs::path& compile_cache::directory() const noexcept {
  return state_->directory;
}

std::uint64_t compile_cache::max_bytes() const noexcept {
  return state_->max_bytes;
}

compile_cache_stats compile_cache::stats() const noexcept {
  return {state_->hits.load(), state_->misses.load(), state_->corrupt_dropped.load(),
          state_->evicted.load(), state_->store_failures.load()};
}

void compile_cache::trim() {
  state_->trim();
}

}  // namespace cubridge
