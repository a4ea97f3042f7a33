#include <cubridge/core/error.hpp>
#include <cubridge/swap/directory_watcher.hpp>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

namespace cubridge {

namespace {
using steady = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& call, const std::filesystem::path& dir) {
  detail::throw_errc(errc::io, call, "watching " + dir.string() + ": " + std::strerror(errno));
}
}  // namespace

struct directory_watcher::state {
  std::filesystem::path directory;
  std::chrono::milliseconds debounce{};
  ready_callback on_ready;
  std::vector<std::string> extensions;
  error_callback on_error;
  int inotify_fd = -1;
  int stop_fd = -1;
  std::thread worker;

  ~state() {
    if (stop_fd >= 0) {
      const std::uint64_t one = 1;
      (void)!write(stop_fd, &one, sizeof one);
    }
    if (worker.joinable()) worker.join();
    if (inotify_fd >= 0) close(inotify_fd);
    if (stop_fd >= 0) close(stop_fd);
  }

  [[nodiscard]] bool wanted(const std::string& name) const {
    if (name.empty() || name.front() == '.') return false;
    if (extensions.empty()) return true;
    const auto ext = std::filesystem::path(name).extension().string();
    for (const auto& e : extensions)
      if (e == ext) return true;
    return false;
  }

  void run() {
    std::map<std::string, steady::time_point> quiet_since;  // file name -> last event
    alignas(inotify_event) char buffer[16 * 1024];
    for (;;) {
      int timeout_ms = -1;
      if (!quiet_since.empty()) {
        auto earliest = steady::time_point::max();
        for (const auto& [name, at] : quiet_since) earliest = std::min(earliest, at + debounce);
        timeout_ms = static_cast<int>(std::max<long long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(earliest - steady::now())
                       .count() +
                   1));
      }
      pollfd fds[2] = {{inotify_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) return;
      if (fds[0].revents & POLLIN) {
        const auto n = read(inotify_fd, buffer, sizeof buffer);
        for (ssize_t offset = 0; n > 0 && offset < n;) {
          const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
          if (event->len && wanted(event->name)) quiet_since[event->name] = steady::now();
          offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        }
      }
      const auto now = steady::now();
      for (auto it = quiet_since.begin(); it != quiet_since.end();) {
        if (now - it->second < debounce) {
          ++it;
          continue;
        }
        const auto path = directory / it->first;
        it = quiet_since.erase(it);
        try {
          on_ready(path);
        } catch (...) {
          if (on_error) on_error(path, std::current_exception());
        }
      }
    }
  }
};

directory_watcher::directory_watcher(std::filesystem::path directory,
                                     std::chrono::milliseconds debounce, ready_callback on_ready,
                                     std::vector<std::string> extensions, error_callback on_error)
    : state_(std::make_unique<state>()) {
  CUBRIDGE_EXPECTS(static_cast<bool>(on_ready), "directory_watcher needs a callback");
  auto& s = *state_;
  s.directory = std::move(directory);
  s.debounce = debounce;
  s.on_ready = std::move(on_ready);
  s.extensions = std::move(extensions);
  s.on_error = std::move(on_error);
  s.inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (s.inotify_fd < 0) fail("inotify_init1", s.directory);
  // Completed writes and files moved in (the atomic way to publish a file) only.
  if (inotify_add_watch(s.inotify_fd, s.directory.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0)
    fail("inotify_add_watch", s.directory);
  s.stop_fd = eventfd(0, EFD_CLOEXEC);
  if (s.stop_fd < 0) fail("eventfd", s.directory);
  s.worker = std::thread([&s] { s.run(); });
}

directory_watcher::~directory_watcher() = default;

const std::filesystem::path& directory_watcher::directory() const noexcept {
  return state_->directory;
}

}  // namespace cubridge
