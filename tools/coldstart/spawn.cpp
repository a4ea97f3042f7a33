#include "spawn.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <optional>

namespace cubridge::tool::coldstart {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t stderr_keep = 4096;

struct pipe_ends {
  unique_fd read;
  unique_fd write;
};

/// A close-on-exec pipe; false (errno set) when none could be made.
bool make_pipe(pipe_ends& out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  out.read.reset(fds[0]);
  out.write.reset(fds[1]);
  return true;
}

/// Reads the child's stdout and stderr until both close or `deadline` passes; returns false at
/// the deadline. Complete stdout lines go to `out.stdout_lines` and `on_line` as they arrive.
bool read_output(unique_fd& out_pipe, unique_fd& err_pipe, clock_type::time_point deadline,
                 child_outcome& out, const std::function<void(const std::string&)>& on_line) {
  std::string partial;
  bool in_time = true;
  char buffer[4096];
  while (out_pipe || err_pipe) {
    const auto now = clock_type::now();
    if (now >= deadline) {
      in_time = false;
      break;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    pollfd polled[2];
    nfds_t n = 0;
    if (out_pipe) polled[n++] = {out_pipe.get(), POLLIN, 0};
    if (err_pipe) polled[n++] = {err_pipe.get(), POLLIN, 0};
    const int ready = ::poll(polled, n, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (nfds_t i = 0; i < n; ++i) {
      if (!(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const bool is_out = polled[i].fd == out_pipe.get();
      const ssize_t got = ::read(polled[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        (is_out ? out_pipe : err_pipe).reset();
        continue;
      }
      if (is_out) {
        partial.append(buffer, static_cast<std::size_t>(got));
        for (std::size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
          out.stdout_lines.push_back(partial.substr(0, nl));
          partial.erase(0, nl + 1);
          if (on_line) on_line(out.stdout_lines.back());
        }
      } else {
        out.stderr_tail.append(buffer, static_cast<std::size_t>(got));
        if (out.stderr_tail.size() > 2 * stderr_keep)
          out.stderr_tail.erase(0, out.stderr_tail.size() - stderr_keep);
      }
    }
  }
  if (!partial.empty()) {
    out.stdout_lines.push_back(partial);
    if (on_line) on_line(partial);
  }
  if (out.stderr_tail.size() > stderr_keep)
    out.stderr_tail.erase(0, out.stderr_tail.size() - stderr_keep);
  return in_time;
}

}  // namespace

std::string child_outcome::describe() const {
  switch (how) {
    case end::exited:
      return "exited with status " + std::to_string(exit_code);
    case end::signaled: {
      const char* name = ::strsignal(signal);
      return "killed by signal " + std::to_string(signal) +
             (name ? std::string(" (") + name + ")" : "");
    }
    case end::timed_out: {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.1f", wall_ms / 1000.0);
      return std::string("timed out after ") + seconds + " s (killed)";
    }
    case end::spawn_failed:
      return "could not be started: " + spawn_error;
  }
  return "?";
}

child_outcome run_child(const child_request& request,
                        const std::function<void(const std::string& line)>& on_line) {
  child_outcome out;
  const auto started = clock_type::now();
  const auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(clock_type::now() - started).count();
  };
  pipe_ends out_pipe, err_pipe;
  const unique_fd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!make_pipe(out_pipe) || !make_pipe(err_pipe) || !null) {
    out.spawn_error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
  cubridge::detail::child_process child;
  try {
    child = cubridge::detail::child_process::spawn(
        {request.program,
         request.args,
         request.env,
         {{0, null.get()}, {1, out_pipe.write.get()}, {2, err_pipe.write.get()}},
         {}});
  } catch (const cubridge::error& e) {
    out.spawn_error = e.involved();  // "<program>: <reason>"
    return out;
  }
  out_pipe.write.reset();
  err_pipe.write.reset();

  const auto deadline = started + request.timeout;
  bool timed_out = !read_output(out_pipe.read, err_pipe.read, deadline, out, on_line);
  // The pipes are closed; the child may still be exiting (or hold on without its output).
  std::optional<cubridge::detail::child_exit> exit;
  if (!timed_out)
    exit = child.wait_for(std::max(deadline - clock_type::now(), clock_type::duration{}));
  if (!exit) {
    timed_out = true;
    (void)child.kill();
    out.how = child_outcome::end::timed_out;
    out.signal = SIGKILL;
  } else if (exit->signaled()) {
    out.how = child_outcome::end::signaled;
    out.signal = exit->signal;
  } else {
    out.how = child_outcome::end::exited;
    out.exit_code = exit->exited() ? exit->exit_code : -1;
  }
  out.wall_ms = elapsed_ms();
  return out;
}

}  // namespace cubridge::tool::coldstart
