#pragma once
// Where a per-user directory of cubridge's lives (the compile cache, the update replay state):
// an override variable, else the XDG base directory's cubridge/, else a folder under $HOME, as
// the XDG base directory specification says (a relative XDG path is ignored). One rule for every
// such directory.

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace cubridge::detail {

/// `$override_variable` when set and non-empty; else `$xdg_variable/cubridge` when absolute; else
/// `$HOME/home_relative/cubridge`; nullopt when none of them is set.
[[nodiscard]] inline std::optional<std::filesystem::path> user_directory(
    const char* override_variable, const char* xdg_variable,
    const std::filesystem::path& home_relative) {
  const auto variable = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value ? value : "");
  };
  if (auto dir = variable(override_variable); !dir.empty()) return dir;
  if (std::filesystem::path xdg = variable(xdg_variable); xdg.is_absolute())
    return xdg / "cubridge";
  if (auto home = variable("HOME"); !home.empty())
    return std::filesystem::path(home) / home_relative / "cubridge";
  return std::nullopt;
}

}  // namespace cubridge::detail
