#pragma once
// Where a service keeps its replay state (update_state.hpp) when it names no state file: one
// directory per user, so that replay protection survives a restart without configuration.
// docs/update-endpoint.md ("Replay state") documents the order.

#include <filesystem>
#include <string_view>

namespace cubridge {

/// The file a gate (update_gate.hpp) keeps in default_state_directory() when it names none.
inline constexpr std::string_view default_state_file_name = "update-state.json";

/// The directory of the default replay state: $CUBRIDGE_STATE_DIR when set and non-empty, else
/// $XDG_STATE_HOME/cubridge when that is an absolute path (the XDG spec ignores relative ones),
/// else $HOME/.local/state/cubridge. Reads the environment only; creates nothing.
/// @throws error (errc::precondition) when none of the three is set.
[[nodiscard]] std::filesystem::path default_state_directory();

}  // namespace cubridge
