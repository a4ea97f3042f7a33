// The replay state's directory and lock file (state_files.hpp).
#include "state_files.hpp"

#include <cubridge/update/update_state.hpp>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cubridge::update_internal {
namespace {

std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

}  // namespace

void create_state_directory(const std::filesystem::path& dir) {
  std::filesystem::path made;
  for (const auto& part : dir.lexically_normal()) {
    made /= part;
    if (part.empty() || made == made.root_path()) continue;
    if (::mkdir(made.c_str(), 0700) == 0 || errno == EEXIST) continue;
    const int error = errno;
    throw update_state_error(
        update_state_reason::write_failed, "update_gate::start",
        "cannot make the state directory " + quoted(made) + ": " + std::strerror(error));
  }
  struct ::stat status {};
  if (::stat(dir.c_str(), &status) != 0 || !S_ISDIR(status.st_mode))
    throw update_state_error(update_state_reason::write_failed, "update_gate::start",
                             "the state directory " + quoted(dir) + " is no directory");
}

state_file_lock::state_file_lock(const std::filesystem::path& state_file) {
  auto lock_file = state_file;
  lock_file += ".lock";
  // O_NOFOLLOW: the lock is never taken through a link someone else placed there.
  fd_.reset(::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd_) {
    const int error = errno;
    throw update_state_error(
        update_state_reason::unreadable, "update_gate::start",
        "cannot open the lock file " + quoted(lock_file) + ": " + std::strerror(error));
  }
  int result;
  do {
    result = ::flock(fd_.get(), LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result == 0) return;
  const int error = errno;
  fd_.reset();
  if (error == EWOULDBLOCK)
    throw update_state_error(update_state_reason::locked, "update_gate::start",
                             quoted(state_file) +
                                 " is in use by another process: give each service its own "
                                 "state_file or CUBRIDGE_STATE_DIR");
  throw update_state_error(update_state_reason::unreadable, "update_gate::start",
                           "cannot lock " + quoted(lock_file) + ": " + std::strerror(error));
}

}  // namespace cubridge::update_internal
