#pragma once
// The files around a gate's replay state (update_gate.hpp): the directory the default one lives
// in, and the advisory lock that keeps two gates off one file. Internal to cubridge_update.

#include <cubridge/core/unique_fd.hpp>

#include <filesystem>

namespace cubridge::update_internal {

/// Makes `dir` and each missing parent with mode 0700 (the XDG base directory spec's mode for
/// state); an existing directory is left as it is. Throws update_state_error (write_failed)
/// naming the directory when one cannot be made or is no directory.
void create_state_directory(const std::filesystem::path& dir);

/// flock(LOCK_EX | LOCK_NB) on `<state_file>.lock` (created 0600), held until destruction. A
/// flock belongs to an open file description, so a second gate on the same file is refused in
/// the same process too. Move-only: it owns the descriptor (unique_fd), whose close releases the
/// lock, so its moves and destructor are the descriptor's.
class state_file_lock {
 public:
  /// Takes the lock. Throws update_state_error: locked when another holder has it ("'<file>' is
  /// in use by another process: ..."), unreadable when the lock file cannot be opened.
  explicit state_file_lock(const std::filesystem::path& state_file);

 private:
  unique_fd fd_;
};

}  // namespace cubridge::update_internal
