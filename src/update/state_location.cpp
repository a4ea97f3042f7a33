// The default replay state directory (state_location.hpp).
#include <cubridge/core/detail/user_directory.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/update/state_location.hpp>

namespace cubridge {

std::filesystem::path default_state_directory() {
  if (auto dir = detail::user_directory("CUBRIDGE_STATE_DIR", "XDG_STATE_HOME", ".local/state"))
    return *dir;
  detail::throw_errc(errc::precondition, "default_state_directory",
                     "none of CUBRIDGE_STATE_DIR, XDG_STATE_HOME and HOME is set: name a "
                     "state_file, set CUBRIDGE_STATE_DIR, or opt out with persist_state = false");
}

}  // namespace cubridge
