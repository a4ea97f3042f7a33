// The compile cache's keys: BLAKE2b-256 over an unambiguous serialisation of everything that
// changes a compile's or a link's output (compile_cache.hpp lists it), and the per-cache secret
// the entries' tags are keyed with (docs/compile-cache.md, "On open").
#include "compile_cache_key.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include "compile_cache_directory.hpp"
#include "compile_cache_includes.hpp"
#include "compile_cache_store.hpp"
#include "detail/ensure_sodium.hpp"

#include <sodium.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

namespace cubridge::compile_cache_internal {

namespace fs = std::filesystem;

namespace {

static_assert(mac_key_bytes == crypto_generichash_KEYBYTES);

// Bumped whenever the key serialisation or the entry layout changes; part of the key, so
// entries of another format are never even opened.
// v2: the entry's tag is keyed (v1's unkeyed hash could be recomputed by anyone).
constexpr std::string_view key_format = "cubridge compile cache key v2";

/// BLAKE2b-256 over a sequence of tagged, length-prefixed fields: unambiguous, so two different
/// inputs never serialise to the same bytes.
class hasher {
 public:
  hasher() {
    detail::ensure_sodium();
    crypto_generichash_init(&state_, nullptr, 0, hash_bytes);
  }
  void raw(const void* data, std::size_t size) {
    crypto_generichash_update(&state_, static_cast<const unsigned char*>(data), size);
  }
  void length(std::uint64_t n) {
    std::array<unsigned char, 8> le{};
    for (std::size_t i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
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

std::string version_text(library_version v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

/// The fields every key starts with: format, kind, the library versions, the architecture.
void hash_common(hasher& h, std::string_view kind, const toolkit_versions& versions,
                 std::string_view architecture) {
  h.field("format", key_format);
  h.field("kind", kind);
  h.field("nvrtc", versions.nvrtc);
  h.field("nvjitlink", versions.nvjitlink);
  h.field("architecture", architecture);
}

/// The in-memory headers, sorted by name (their order does not change the compile).
void hash_headers(hasher& h, const std::vector<source_header>& headers) {
  std::vector<const source_header*> sorted;
  sorted.reserve(headers.size());
  for (const auto& header : headers) sorted.push_back(&header);
  std::sort(sorted.begin(), sorted.end(),
            [](const source_header* a, const source_header* b) { return a->name < b->name; });
  for (const auto* header : sorted) {
    h.field("header name", header->name);
    h.field("header content", header->content);
  }
}

// ---- the per-cache secret ----------------------------------------------------------------------

/// What a refusal or failure of one cache's key file says.
struct key_file_texts {
  explicit key_file_texts(const fs::path& directory)
      : path(directory / mac_key_name),
        which("'" + path.string() + "', the key of compile cache '" + directory.string() + "'"),
        required("a regular file of " + std::to_string(mac_key_bytes) + " bytes owned by uid " +
                 std::to_string(::geteuid()) +
                 " with mode 0600 (remove it to make a new key: every entry is then compiled "
                 "again)") {}

  /// Throws cubridge::error (errc::io): "compile cache key '<path>': <what>".
  [[noreturn]] void fail(const std::string& what) const {
    detail::throw_errc(errc::io, "compile_cache::open",
                       "compile cache key '" + path.string() + "': " + what);
  }

  fs::path path;
  std::string which;
  std::string required;
};

/// Reads the existing key into `key`; false when there is none. Refuses a key file that is not
/// a regular 32-byte file of the user's with no permission bits for group or others.
bool read_mac_key(int directory_fd, const key_file_texts& texts, mac_key& key) {
  unique_fd fd(
      ::openat(directory_fd, mac_key_name.data(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return false;
    const int saved = errno;
    struct stat info {};
    if (::fstatat(directory_fd, mac_key_name.data(), &info, AT_SYMLINK_NOFOLLOW) == 0)
      refuse(texts.which, describe(info), texts.required);
    texts.fail(std::string("cannot be opened: ") + std::strerror(saved));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) texts.fail(std::strerror(errno));
  if (!S_ISREG(info.st_mode) || info.st_uid != ::geteuid() || (info.st_mode & 077) != 0 ||
      info.st_size != static_cast<off_t>(mac_key_bytes))
    refuse(texts.which, describe(info) + ", " + std::to_string(info.st_size) + " bytes",
           texts.required);
  if (!read_all(fd.get(), key.data(), key.size())) texts.fail("short read");
  return true;
}

/// Makes a new key unless another process made one first (then that one stays, to be read).
void create_mac_key(int directory_fd, const key_file_texts& texts) {
  // The temporary name's tag is all zeros (it is no entry's key).
  const std::string temp = make_temp_name(std::string(64, '0'));
  unique_fd out(::openat(directory_fd, temp.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) texts.fail(std::string("cannot be created: ") + std::strerror(errno));
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
  if (!written) texts.fail("cannot be written: " + std::string(std::strerror(saved)));
  if (linked != 0 && saved != EEXIST)  // EEXIST: another process made one first; use it
    texts.fail(std::string("cannot be created: ") + std::strerror(saved));
  ::fsync(directory_fd);
}

}  // namespace

toolkit_versions current_toolkit_versions() {
  return {version_text(nvrtc_version()), version_text(nvjitlink_version())};
}

hash_value compile_key(const toolkit_versions& versions, const cuda_source& source,
                       const compile_options& options) {
  const auto files = scan_includes(source, options);
  hasher h;
  hash_common(h, "nvrtc cubin", versions, options.architecture);
  h.field("source name", source.name);
  h.field("source", source.text);
  hash_headers(h, options.headers);
  for (const auto& path : options.include_paths) h.field("include path", path.string());
  for (const auto& [name, value] : options.defines) {
    h.field("define name", name);
    h.field("define value", value);
  }
  const std::set<std::string> expressions(options.name_expressions.begin(),
                                          options.name_expressions.end());
  for (const auto& expression : expressions) h.field("name expression", expression);
  for (const auto& option : options.extra_options) h.field("option", option);
  // The toolkit's headers by their directories: their content goes with the NVRTC version.
  if (options.search_toolkit_headers)
    for (const auto& path : toolkit_include_paths()) h.field("toolkit include path", path.string());
  for (const auto& [path, content] : files) {
    h.field("file path", path);
    h.field("file content", content);
  }
  return h.finish();
}

hash_value link_key(const toolkit_versions& versions, std::string_view ptx,
                    const ptx_link_options& options) {
  hasher h;
  hash_common(h, "ptx cubin", versions, options.architecture);
  h.field("source name", options.name);
  h.field("ptx", ptx);
  for (const auto& option : options.extra_options) h.field("option", option);
  return h.finish();
}

mac_key load_or_create_mac_key(int directory_fd, const fs::path& directory) {
  const key_file_texts texts(directory);
  mac_key key{};
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (read_mac_key(directory_fd, texts, key)) return key;
    create_mac_key(directory_fd, texts);
  }
  texts.fail("vanished while being created");
}

}  // namespace cubridge::compile_cache_internal
