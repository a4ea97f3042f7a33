#pragma once
// A process's living children and descendants, read from /proc (Linux), for ending what a child
// process left behind: the sandbox worker (a child subreaper, so that its library's orphans stay
// its descendants) ends its own on the way out, the host ends a worker's before killing it.

#include <sys/types.h>

#include <vector>

namespace cubridge::detail {

/// The children of `pid` (every thread's, /proc/<pid>/task/*/children), zombies left out; empty
/// when it is gone or the kernel does not list children.
[[nodiscard]] std::vector<pid_t> living_children(pid_t pid);

/// Whether process `pid` has ended: gone, or a zombie nobody reaped yet.
[[nodiscard]] bool has_ended(pid_t pid);

/// Every living descendant of `pid`, parents before their children.
[[nodiscard]] std::vector<pid_t> living_descendants(pid_t pid);

/// Kills (SIGKILL) every living descendant of `pid`, in rounds until none is left or `rounds`
/// are done (a killed process's children are re-parented meanwhile: to `pid` when it is a child
/// subreaper). Returns how many processes it signalled.
std::size_t kill_descendants(pid_t pid, int rounds = 8) noexcept;

}  // namespace cubridge::detail
