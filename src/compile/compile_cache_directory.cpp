// The compile cache's trust checks: the ownership and modes the cache directory, the directories
// above it and the entries must have, and opening the directory component by component.
#include "compile_cache_directory.hpp"

#include <cubridge/core/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

namespace cubridge::compile_cache_internal {

namespace fs = std::filesystem;

namespace {

constexpr mode_t written_by_others = S_IWGRP | S_IWOTH;

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

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

/// What open_cache_directory says when it fails or refuses, for one directory given to open().
class directory_checks {
 public:
  explicit directory_checks(const fs::path& directory)
      : directory_(directory),
        user_text_("uid " + std::to_string(::geteuid()) + " (the effective user)"),
        cache_required_("a directory owned by " + user_text_ +
                        " and not writable by group or others (chmod 700)"),
        ancestor_required_("every directory above the cache owned by root or " + user_text_ +
                           " and not writable by group or others unless sticky (as /tmp is)") {}

  /// Throws cubridge::error (errc::io): "opening compile cache '<dir>': '<path>' <what>".
  [[noreturn]] void fail(const fs::path& path, const std::string& what) const {
    detail::throw_errc(
        errc::io, "compile_cache::open",
        "opening compile cache '" + directory_.string() + "': '" + path.string() + "' " + what);
  }

  /// Refuses `path`, the cache itself when `is_cache`, else a directory above it, as found.
  [[noreturn]] void refuse_found(const fs::path& path, const struct stat& found,
                                 bool is_cache) const {
    if (is_cache)
      refuse("compile cache '" + directory_.string() + "'", describe(found), cache_required_);
    refuse("'" + path.string() + "', a directory above compile cache '" + directory_.string() + "'",
           describe(found), ancestor_required_);
  }

  /// Refuses `path` unless it passes the check of the cache (`is_cache`) or of a directory
  /// above it.
  void require_safe(const fs::path& path, const struct stat& info, bool is_cache) const {
    const bool safe = is_cache ? safe_cache_directory(info) : safe_ancestor(info);
    if (!safe) refuse_found(path, info, is_cache);
  }

 private:
  fs::path directory_;
  std::string user_text_;
  std::string cache_required_;
  std::string ancestor_required_;
};

/// `directory` made absolute with its links resolved: the path that is checked.
fs::path resolved_path(const fs::path& directory) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(directory, ec);
  fs::path resolved = ec ? fs::path() : fs::weakly_canonical(absolute, ec);
  if (ec)
    detail::throw_errc(errc::io, "compile_cache::open",
                       "opening compile cache '" + directory.string() + "': " + ec.message());
  return resolved;
}

/// The names below the root of `path`, in order.
std::vector<std::string> components_of(const fs::path& path) {
  std::vector<std::string> parts;
  for (const auto& part : path.relative_path())
    if (!part.empty() && part != ".") parts.push_back(part.string());
  return parts;
}

/// Opens directory `name` in `parent` without following a link, creating it (mode 0700) if it
/// is missing; `created` says whether this call made it. `at` is its path, `is_cache` whether
/// it is the cache itself: a name that is not a directory (or is a link) is refused as that.
unique_fd open_or_create_component(int parent, const std::string& name, const fs::path& at,
                                   bool is_cache, const directory_checks& checks, bool& created) {
  constexpr int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  created = false;
  unique_fd next(::openat(parent, name.c_str(), flags));
  if (!next && errno == ENOENT) {
    if (::mkdirat(parent, name.c_str(), 0700) == 0) {
      created = true;
    } else if (errno != EEXIST) {  // EEXIST: another process made it meanwhile
      checks.fail(at, std::string("cannot be created: ") + std::strerror(errno));
    }
    next.reset(::openat(parent, name.c_str(), flags));
  }
  if (!next) {
    const int saved = errno;
    struct stat link {};
    // Not a directory, or a link that appeared after the path was resolved.
    if (::fstatat(parent, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(link.st_mode))
      checks.refuse_found(at, link, is_cache);
    checks.fail(at, std::string("cannot be opened: ") + std::strerror(saved));
  }
  return next;
}

/// A directory this open() made (`fd`, at `at`, as `info` found it) is made exactly 0700: the
/// umask may have taken bits away. `info` is updated to match.
void make_exactly_0700(int fd, struct stat& info, const fs::path& at,
                       const directory_checks& checks) {
  if (info.st_uid != ::geteuid() || (info.st_mode & 07777) == 0700) return;
  if (::fchmod(fd, 0700) != 0) checks.fail(at, std::string("chmod: ") + std::strerror(errno));
  info.st_mode = (info.st_mode & ~mode_t{07777}) | 0700;
}

}  // namespace

std::string describe(const struct stat& info) {
  const char* kind = S_ISDIR(info.st_mode)    ? "a directory"
                     : S_ISREG(info.st_mode)  ? "a regular file"
                     : S_ISLNK(info.st_mode)  ? "a symbolic link"
                     : S_ISFIFO(info.st_mode) ? "a FIFO"
                                              : "a special file";
  return std::string(kind) + " owned by uid " + std::to_string(info.st_uid) + ", mode " +
         octal_mode(info.st_mode);
}

void refuse(const std::string& which, const std::string& found, const std::string& required) {
  detail::throw_errc(errc::io, "compile_cache::open",
                     "refusing " + which + ": found " + found + "; required: " + required);
}

bool safe_file(const struct stat& info) {
  return S_ISREG(info.st_mode) && info.st_uid == ::geteuid() &&
         (info.st_mode & written_by_others) == 0;
}

unique_fd open_cache_directory(const fs::path& directory) {
  const directory_checks checks(directory);
  const fs::path resolved = resolved_path(directory);
  const std::vector<std::string> parts = components_of(resolved);
  fs::path at = resolved.root_path();
  unique_fd current(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!current) checks.fail(at, std::string("cannot be opened: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(current.get(), &info) != 0) checks.fail(at, std::strerror(errno));
  checks.require_safe(at, info, parts.empty());

  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool is_cache = i + 1 == parts.size();
    at /= parts[i];
    bool created = false;
    unique_fd next =
        open_or_create_component(current.get(), parts[i], at, is_cache, checks, created);
    if (::fstat(next.get(), &info) != 0) checks.fail(at, std::strerror(errno));
    if (created) make_exactly_0700(next.get(), info, at, checks);
    checks.require_safe(at, info, is_cache);
    current = std::move(next);
  }
  return current;
}

}  // namespace cubridge::compile_cache_internal
