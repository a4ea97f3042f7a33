#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/core/error.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>
#include <utility>

extern char** environ;

namespace cubridge::detail {
namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void spawn_failed(const std::string& program, const std::string& why) {
  throw_errc(errc::io, "posix_spawn", program + ": " + why);
}

void check_fds(const child_spec& spec) {
  CUBRIDGE_EXPECTS(!spec.program.empty(), "starting a child process with no program");
  std::vector<int> seen;
  for (const child_fd& f : spec.fds) {
    CUBRIDGE_EXPECTS(f.child >= 0 && f.child < max_child_fd,
                     spec.program + ": child descriptor " + std::to_string(f.child) +
                         " is outside 0.." + std::to_string(max_child_fd - 1));
    CUBRIDGE_EXPECTS(f.parent >= 0, spec.program + ": the child's descriptor " +
                                        std::to_string(f.child) + " from parent descriptor " +
                                        std::to_string(f.parent) + ", which cannot be open");
    CUBRIDGE_EXPECTS(
        std::find(seen.begin(), seen.end(), f.child) == seen.end(),
        spec.program + ": child descriptor " + std::to_string(f.child) + " named twice");
    seen.push_back(f.child);
  }
}

/// The highest descriptor number the child gets from the parent (2 at least: 0-2 always count).
int highest_child_fd(const child_spec& spec) noexcept {
  int highest = 2;
  for (const child_fd& f : spec.fds) highest = std::max(highest, f.child);
  return highest;
}

/// posix_spawn's file actions and attributes, destroyed at scope exit.
struct spawn_setup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attributes{};
  spawn_setup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~spawn_setup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  spawn_setup(const spawn_setup&) = delete;
  spawn_setup& operator=(const spawn_setup&) = delete;
};

/// Fills `setup` for `spec`. `sources` are the parent's descriptors duplicated above every child
/// number: no dup2 in the child then overwrites a source still to be duplicated, nor is onto
/// itself (which would leave close-on-exec set). Returns 0 or an errno.
int prepare(const child_spec& spec, const std::vector<unique_fd>& sources, spawn_setup& setup) {
  const int highest = highest_child_fd(spec);
  int rc = 0;
  for (std::size_t i = 0; i < spec.fds.size() && rc == 0; ++i)
    rc = posix_spawn_file_actions_adddup2(&setup.actions, sources[i].get(), spec.fds[i].child);
  // Nothing else reaches the child: the gaps below the highest number, then everything above.
  for (int n = 3; n <= highest && rc == 0; ++n)
    if (std::none_of(spec.fds.begin(), spec.fds.end(),
                     [n](const child_fd& f) { return f.child == n; }))
      rc = posix_spawn_file_actions_addclose(&setup.actions, n);
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&setup.actions, highest + 1);
  if (rc == 0 && !spec.working_directory.empty())
    rc = posix_spawn_file_actions_addchdir_np(&setup.actions, spec.working_directory.c_str());
  // The parent's blocked signals (a thread that waits in sigwait) are not the child's business.
  sigset_t none;
  sigemptyset(&none);
  if (rc == 0) rc = posix_spawnattr_setsigmask(&setup.attributes, &none);
  short flags = POSIX_SPAWN_SETSIGMASK;
  if (spec.own_process_group) {
    if (rc == 0) rc = posix_spawnattr_setpgroup(&setup.attributes, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  if (rc == 0) rc = posix_spawnattr_setflags(&setup.attributes, flags);
  return rc;
}

std::vector<char*> pointers(const std::vector<std::string>& strings, const std::string* first) {
  std::vector<char*> out;
  if (first) out.push_back(const_cast<char*>(first->c_str()));
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

child_exit exit_of(int wait_status) noexcept {
  child_exit e;
  if (WIFSIGNALED(wait_status)) {
    e.how = child_exit::kind::signaled;
    e.signal = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    e.how = child_exit::kind::exited;
    e.exit_code = WEXITSTATUS(wait_status);
  }
  return e;
}

child_exit no_child() noexcept {
  child_exit e;
  e.wait_error = ECHILD;
  return e;
}

}  // namespace

std::string child_exit::describe() const {
  switch (how) {
    case kind::exited:
      return "exited with status " + std::to_string(exit_code);
    case kind::signaled: {
      const char* name = ::strsignal(signal);
      return "killed by signal " + std::to_string(signal) + " (" + (name ? name : "?") + ")";
    }
    case kind::unknown:
      break;
  }
  return std::string("ended, exit status unknown (waitpid: ") + std::strerror(wait_error) +
         "; is SIGCHLD ignored?)";
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> environment_with(const std::vector<std::string>& overrides,
                                          const std::vector<std::string>& removed) {
  const auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> names;
  names.reserve(overrides.size() + removed.size());
  for (const auto& o : overrides) names.push_back(name_of(o));
  names.insert(names.end(), removed.begin(), removed.end());
  std::vector<std::string> env;
  for (auto& entry : current_environment())
    if (std::find(names.begin(), names.end(), name_of(entry)) == names.end())
      env.push_back(std::move(entry));
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

child_process child_process::spawn(const child_spec& spec) {
  check_fds(spec);
  const int highest = highest_child_fd(spec);
  std::vector<unique_fd> sources;
  for (const child_fd& f : spec.fds) {
    sources.emplace_back(::fcntl(f.parent, F_DUPFD_CLOEXEC, highest + 1));
    if (!sources.back())
      spawn_failed(spec.program, "cannot duplicate descriptor " + std::to_string(f.parent) +
                                     " for the child's " + std::to_string(f.child) + ": " +
                                     std::strerror(errno));
  }
  spawn_setup setup;
  if (const int rc = prepare(spec, sources, setup); rc != 0)
    spawn_failed(spec.program, std::string("preparing the spawn: ") + std::strerror(rc));
  const auto argv = pointers(spec.args, &spec.program);
  const auto envp = pointers(spec.environment, nullptr);
  pid_t pid = 0;
  if (const int rc = ::posix_spawn(&pid, spec.program.c_str(), &setup.actions, &setup.attributes,
                                   argv.data(), envp.data());
      rc != 0)
    spawn_failed(spec.program, std::strerror(rc));
  return child_process(pid, spec.own_process_group);
}

child_process::child_process(pid_t pid, bool own_group) noexcept
    : pid_(pid), own_group_(own_group) {
  // No pidfd (a kernel before 5.3, a seccomp filter): wait_for polls the status instead.
#ifdef SYS_pidfd_open
  pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
}

child_process::child_process(child_process&& other) noexcept
    : pid_(std::exchange(other.pid_, 0)),
      own_group_(std::exchange(other.own_group_, false)),
      pidfd_(std::move(other.pidfd_)) {}

child_process& child_process::operator=(child_process&& other) noexcept {
  if (this != &other) {
    if (running()) (void)kill();
    pid_ = std::exchange(other.pid_, 0);
    own_group_ = std::exchange(other.own_group_, false);
    pidfd_ = std::move(other.pidfd_);
  }
  return *this;
}

child_process::~child_process() {
  if (running()) (void)kill();
}

void child_process::forget() noexcept {
  pid_ = 0;
  own_group_ = false;
  pidfd_.reset();
}

std::optional<child_exit> child_process::reap(bool block) noexcept {
  if (!running()) return no_child();
  if (own_group_) {
    // Ended, not yet reaped: the group id is still the child's, so what is left of its group
    // (and nothing else) is killed before the reap frees the id.
    siginfo_t info{};
    int r = 0;
    do {
      r = ::waitid(P_PID, static_cast<id_t>(pid_), &info,
                   WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
    } while (r < 0 && errno == EINTR);
    if (r == 0 && info.si_pid == 0) return std::nullopt;  // still running
    if (r == 0) ::kill(-pid_, SIGKILL);
  }
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
    if (r == 0) return std::nullopt;
    const int wait_error = r < 0 ? errno : 0;
    if (wait_error == EINTR) continue;
    child_exit e = r < 0 ? child_exit{} : exit_of(status);
    e.wait_error = wait_error;
    forget();
    return e;
  }
}

std::optional<child_exit> child_process::try_wait() noexcept {
  return reap(false);
}

std::optional<child_exit> child_process::wait_for(std::chrono::nanoseconds timeout) noexcept {
  const auto start = clock_type::now();
  // Saturating: a timeout of nanoseconds::max() means "no limit", not an overflow.
  const auto deadline = timeout >= clock_type::time_point::max() - start
                            ? clock_type::time_point::max()
                            : start + timeout;
  for (;;) {
    if (auto e = reap(false)) return e;
    const auto now = clock_type::now();
    if (now >= deadline) return std::nullopt;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (pidfd_) {
      pollfd p{pidfd_.get(), POLLIN, 0};
      (void)::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), INT_MAX)));
    } else {
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(1)));
    }
  }
}

child_exit child_process::wait() noexcept {
  return *reap(true);
}

void child_process::send_kill() noexcept {
  // The pid is ours until reaped, so it cannot name another process (or group) yet.
  if (running()) ::kill(own_group_ ? -pid_ : pid_, SIGKILL);
}

child_exit child_process::kill() noexcept {
  if (!running()) return no_child();
  send_kill();
  return *reap(true);
}

pid_t child_process::release() noexcept {
  const pid_t pid = pid_;
  forget();
  return pid;
}

}  // namespace cubridge::detail
