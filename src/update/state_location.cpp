// The default replay state directory (state_location.hpp).
#include <cubridge/core/error.hpp>
#include <cubridge/update/state_location.hpp>

#include <cstdlib>
#include <string>

namespace cubridge {
namespace {

// The variable's value; empty when unset or empty.
std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

std::filesystem::path default_state_directory() {
  if (auto dir = environment("CUBRIDGE_STATE_DIR"); !dir.empty()) return dir;
  if (std::filesystem::path xdg = environment("XDG_STATE_HOME"); xdg.is_absolute())
    return xdg / "cubridge";
  if (auto home = environment("HOME"); !home.empty())
    return std::filesystem::path(home) / ".local" / "state" / "cubridge";
  detail::throw_errc(errc::precondition, "default_state_directory",
                     "none of CUBRIDGE_STATE_DIR, XDG_STATE_HOME and HOME is set: name a "
                     "state_file, set CUBRIDGE_STATE_DIR, or opt out with persist_state = false");
}

}  // namespace cubridge
