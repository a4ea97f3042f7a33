// A process's children and descendants from /proc (process_tree.hpp).
#include <cubridge/core/detail/process_tree.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>

namespace cubridge::detail {
bool has_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // "pid (comm) state ...": comm may hold spaces and parentheses, the last ')' ends it.
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' ||
         line[close + 2] == 'X';
}

std::vector<pid_t> living_children(pid_t pid) {
  std::vector<pid_t> found;
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream list(task.path() / "children");
    for (pid_t child = 0; list >> child;)
      if (!has_ended(child)) found.push_back(child);
  }
  return found;
}

std::vector<pid_t> living_descendants(pid_t pid) {
  std::vector<pid_t> found = living_children(pid);
  // Breadth first; a process tree has no cycles, and the bound keeps a racing fork finite.
  for (std::size_t i = 0; i < found.size() && found.size() < 65536; ++i)
    for (const pid_t child : living_children(found[i])) found.push_back(child);
  return found;
}

std::size_t kill_descendants(pid_t pid, int rounds) noexcept {
  std::size_t signalled = 0;
  try {
    for (int round = 0; round < rounds; ++round) {
      const auto descendants = living_descendants(pid);
      if (descendants.empty()) break;
      for (const pid_t p : descendants) signalled += ::kill(p, SIGKILL) == 0 ? 1U : 0U;
      ::usleep(2000);  // let the killed ones die and their children be re-parented
    }
  } catch (...) {
    // /proc unreadable (no memory for a path): what was signalled stays signalled.
  }
  return signalled;
}

}  // namespace cubridge::detail
