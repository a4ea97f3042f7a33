#include "spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <algorithm>

extern char** environ;

namespace cubridge::tool::coldstart {
namespace {

constexpr std::size_t stderr_keep = 4096;

struct fd_pair {
  int read = -1;
  int write = -1;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool wait_child(pid_t pid, int& status, bool block) {
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, block ? 0 : WNOHANG);
    if (r == pid) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // ECHILD: nothing left to wait for
  }
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

std::vector<std::string> environment_with(const std::vector<std::string>& overrides,
                                          const std::vector<std::string>& removed) {
  const auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> names;
  for (const auto& o : overrides) names.push_back(name_of(o));
  names.insert(names.end(), removed.begin(), removed.end());
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (std::find(names.begin(), names.end(), name_of(entry)) == names.end())
      env.push_back(std::move(entry));
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

child_outcome run_child(const child_request& request,
                        const std::function<void(const std::string& line)>& on_line) {
  using clock = std::chrono::steady_clock;
  child_outcome out;
  const auto started = clock::now();
  const auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(clock::now() - started).count();
  };

  fd_pair out_pipe;
  fd_pair err_pipe;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.spawn_error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
  out_pipe = {fds[0], fds[1]};
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.spawn_error = std::string("pipe: ") + std::strerror(errno);
    close_fd(out_pipe.read);
    close_fd(out_pipe.write);
    return out;
  }
  err_pipe = {fds[0], fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe.write, 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe.write, 2);

  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(request.program.c_str()));
  for (const auto& a : request.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  pid_t pid = -1;
  const int spawn_rc =
      ::posix_spawn(&pid, request.program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close_fd(out_pipe.write);
  close_fd(err_pipe.write);
  if (spawn_rc != 0) {
    out.spawn_error = request.program + ": " + std::strerror(spawn_rc);
    close_fd(out_pipe.read);
    close_fd(err_pipe.read);
    return out;
  }

  const auto deadline = started + request.timeout;
  std::string partial;
  bool timed_out = false;
  char buffer[4096];
  while (out_pipe.read >= 0 || err_pipe.read >= 0) {
    const auto now = clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    pollfd polled[2];
    nfds_t n = 0;
    if (out_pipe.read >= 0) polled[n++] = {out_pipe.read, POLLIN, 0};
    if (err_pipe.read >= 0) polled[n++] = {err_pipe.read, POLLIN, 0};
    const int ready = ::poll(polled, n, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (nfds_t i = 0; i < n; ++i) {
      if (!(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const bool is_out = polled[i].fd == out_pipe.read;
      const ssize_t got = ::read(polled[i].fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close_fd(is_out ? out_pipe.read : err_pipe.read);
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
  close_fd(out_pipe.read);
  close_fd(err_pipe.read);
  if (!partial.empty()) {
    out.stdout_lines.push_back(partial);
    if (on_line) on_line(partial);
  }
  if (out.stderr_tail.size() > stderr_keep)
    out.stderr_tail.erase(0, out.stderr_tail.size() - stderr_keep);

  int status = 0;
  // The pipes are closed; the child may still be exiting (or hold on without its output).
  while (!timed_out && !wait_child(pid, status, false)) {
    if (clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    ::usleep(1000);
  }
  if (timed_out) {
    ::kill(pid, SIGKILL);
    wait_child(pid, status, true);
    out.how = child_outcome::end::timed_out;
    out.signal = SIGKILL;
  } else if (WIFSIGNALED(status)) {
    out.how = child_outcome::end::signaled;
    out.signal = WTERMSIG(status);
  } else {
    out.how = child_outcome::end::exited;
    out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  out.wall_ms = elapsed_ms();
  return out;
}

}  // namespace cubridge::tool::coldstart
