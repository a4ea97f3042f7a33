#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#ifndef CUBRIDGE_SANDBOX_WORKER_INSTALLED
#define CUBRIDGE_SANDBOX_WORKER_INSTALLED "/usr/local/libexec/cubridge-sandbox-worker"
#endif

namespace cubridge {

namespace protocol = detail::sandbox_protocol;
using clock_type = std::chrono::steady_clock;

std::string_view to_string(sandbox_failure reason) noexcept {
  switch (reason) {
    case sandbox_failure::crashed:
      return "crashed";
    case sandbox_failure::aborted:
      return "aborted";
    case sandbox_failure::timed_out:
      return "timed_out";
    case sandbox_failure::cuda_fault:
      return "cuda_fault";
    case sandbox_failure::protocol:
      return "protocol";
    case sandbox_failure::start_failed:
      return "start_failed";
    case sandbox_failure::no_such_entry:
      return "no_such_entry";
    case sandbox_failure::buffer_import_failed:
      return "buffer_import_failed";
  }
  return "unknown";
}

namespace {

std::string restart_text(bool restarted, std::chrono::nanoseconds duration) {
  if (!restarted) return "";
  return "; worker restarted in " +
         std::to_string(std::chrono::duration<double, std::milli>(duration).count()) + " ms";
}

}  // namespace

sandbox_error::sandbox_error(sandbox_failure reason, std::string call, std::string detail,
                             bool restarted, std::chrono::nanoseconds restart_duration,
                             std::source_location where)
    : error(isolation_error_domain, static_cast<int>(isolation_errc::sandbox_failure),
            "sandbox " + std::string(cubridge::to_string(reason)), std::move(call),
            detail + restart_text(restarted, restart_duration), where),
      reason_(reason),
      restarted_(restarted),
      restart_duration_(restart_duration) {}

namespace {

/// How a worker ended.
struct worker_end {
  sandbox_failure reason = sandbox_failure::crashed;
  std::string text;  // "killed by signal 11 (Segmentation fault)"
  int exit_code = -1;
};

/// A running worker: its process and our end of the socket. Move-only; the destructor closes
/// the socket and reaps the process (SIGKILL if it does not exit within a grace period).
class worker_process {
 public:
  worker_process() = default;
  worker_process(pid_t pid, unique_fd socket) noexcept : pid_(pid), socket_(std::move(socket)) {}
  worker_process(worker_process&& o) noexcept
      : pid_(std::exchange(o.pid_, 0)), socket_(std::move(o.socket_)) {}
  worker_process& operator=(worker_process&& o) noexcept {
    if (this != &o) {
      stop();
      pid_ = std::exchange(o.pid_, 0);
      socket_ = std::move(o.socket_);
    }
    return *this;
  }
  ~worker_process() { stop(); }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] int socket() const noexcept { return socket_.get(); }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }

  /// Graceful end: close the socket (the worker exits on EOF), give it `grace`, then SIGKILL.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000)) noexcept {
    if (pid_ <= 0) return;
    socket_.reset();
    (void)wait_for_exit(grace);
    if (pid_ > 0) (void)kill_and_reap();
  }

  /// SIGKILL and reap. Returns how it ended (killed, or whatever it did first).
  worker_end kill_and_reap() noexcept {
    if (pid_ <= 0) return {sandbox_failure::crashed, "no worker", -1};
    ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    return finish(r, status);
  }

  /// Waits up to `timeout` for the worker to exit by itself; nullopt if it still runs.
  std::optional<worker_end> wait_for_exit(std::chrono::milliseconds timeout) noexcept {
    if (pid_ <= 0) return worker_end{sandbox_failure::crashed, "no worker", -1};
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r != 0 && !(r < 0 && errno == EINTR)) return finish(r, status);
      if (clock_type::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  worker_end finish(pid_t r, int status) noexcept {
    const pid_t pid = std::exchange(pid_, 0);
    socket_.reset();
    worker_end end;
    if (r < 0) {
      end.text = "worker pid " + std::to_string(pid) +
                 " ended, exit status unknown (waitpid: " + std::strerror(errno) +
                 "; is SIGCHLD ignored?)";
      return end;
    }
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      end.reason = sig == SIGABRT ? sandbox_failure::aborted : sandbox_failure::crashed;
      const char* name = ::strsignal(sig);
      end.text = "worker pid " + std::to_string(pid) + " killed by signal " + std::to_string(sig) +
                 " (" + (name ? name : "?") + ")";
    } else if (WIFEXITED(status)) {
      end.exit_code = WEXITSTATUS(status);
      end.text = "worker pid " + std::to_string(pid) + " exited with status " +
                 std::to_string(end.exit_code);
    }
    return end;
  }

  pid_t pid_ = 0;
  unique_fd socket_;
};

bool is_executable(const std::filesystem::path& p) {
  return !p.empty() && ::access(p.c_str(), X_OK) == 0 && !std::filesystem::is_directory(p);
}

}  // namespace

// --- shared state -------------------------------------------------------------------------------

struct sandbox::state {
  explicit state(sandbox_options o) : options(std::move(o)) {}

  struct shared_buffer {
    unique_fd fd;  // exported once; SCM_RIGHTS sends a duplicate to each worker
    std::uint64_t size = 0;
    CUdeviceptr host_address = 0;
    int device = 0;
    std::uint64_t mapped_generation = 0;  // the worker generation that has it mapped (0: none)
  };

  sandbox_options options;
  std::string name;
  std::filesystem::path worker_path;
  mutable std::mutex mutex;  // one call at a time; guards everything below
  worker_process worker;
  std::uint64_t generation = 0;  // counts workers started
  std::size_t restarts = 0;
  std::chrono::nanoseconds last_start{0};
  std::string cuda_status;
  std::map<std::uint64_t, shared_buffer> shares;
  std::uint64_t next_share_id = 1;

  [[nodiscard]] std::string who() const {
    return "sandbox '" + name + "' (library " + options.library.string() + ", worker pid " +
           std::to_string(worker.pid()) + ")";
  }

  /// Starts a worker (the old one must be gone). Returns an empty string or why it failed.
  std::string start_worker() {
    const auto started = clock_type::now();
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      return std::string("socketpair failed: ") + std::strerror(errno);
    unique_fd host_end(pair[0]);
    // The worker's end goes to fd 3 in the child; keep it off 0-9 so dup2 never is a no-op that
    // would leave FD_CLOEXEC set.
    unique_fd child_end(::fcntl(pair[1], F_DUPFD_CLOEXEC, 10));
    ::close(pair[1]);
    if (!child_end) return std::string("fcntl(F_DUPFD_CLOEXEC) failed: ") + std::strerror(errno);

    // Everything the child needs is built before fork: after it only async-signal-safe calls.
    std::vector<std::string> args = {
        worker_path.string(), "--socket=3", "--library=" + options.library.string(),
        "--device=" + std::to_string(options.device),
        std::string("--cuda=") + (options.initialize_cuda ? "1" : "0")};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int child_fd = child_end.get();

    const pid_t pid = ::fork();
    if (pid < 0) return std::string("fork failed: ") + std::strerror(errno);
    if (pid == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (::dup2(child_fd, 3) != 3) _exit(127);
      // Nothing else of the host's leaks into the worker (an inherited socket of another
      // sandbox would keep that worker from seeing its host go away).
      ::close_range(4, ~0U, 0);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    child_end.reset();
    worker = worker_process(pid, std::move(host_end));
    ++generation;

    protocol::frame f;
    std::string failure;
    try {
      const auto status =
          protocol::receive_frame(worker.socket(), f, clock_type::now() + options.start_timeout);
      if (status == protocol::receive_status::ok && f.type == protocol::message_type::ready) {
        cuda_status = protocol::decode_ready(f.payload).cuda_status;
        last_start = clock_type::now() - started;
        return {};
      }
      if (status == protocol::receive_status::timed_out) {
        failure = "the worker did not report ready within " +
                  std::to_string(options.start_timeout.count()) + " ms; killed";
      } else if (status == protocol::receive_status::closed) {
        auto end = worker.wait_for_exit(std::chrono::milliseconds(2000));
        failure = end ? end->text : "the worker closed its socket";
        if (end && end->exit_code == 127)
          failure += " (could not execute " + worker_path.string() + ")";
      } else if (f.type == protocol::message_type::start_failed) {
        failure = protocol::decode_start_failed(f.payload).reason;
      } else {
        failure = "the worker sent message type " + std::to_string(static_cast<int>(f.type)) +
                  " instead of ready";
      }
    } catch (const std::exception& e) {
      failure = std::string("bad start message: ") + e.what();
    }
    worker.kill_and_reap();
    return failure;
  }

  struct restart_outcome {
    std::string failure;  ///< empty when the fresh worker is ready
    std::chrono::nanoseconds duration;
  };
  /// Ends the worker if it still runs (SIGKILL) and starts a fresh one.
  restart_outcome restart() {
    const auto started = clock_type::now();
    if (worker.running()) worker.kill_and_reap();
    ++restarts;
    auto failure = start_worker();
    return {std::move(failure), clock_type::now() - started};
  }

  /// Reports a failed call: the worker (killed here if it still runs) is replaced first.
  [[noreturn]] void fail(sandbox_failure reason, const std::string& entry,
                         const std::string& detail) {
    const auto outcome = restart();
    const bool restarted = outcome.failure.empty();
    throw sandbox_error(reason, "sandbox::call(\"" + entry + "\")",
                        "sandbox '" + name + "' (library " + options.library.string() + "): " +
                            detail + (restarted ? "" : "; the worker could NOT be restarted"),
                        restarted, outcome.duration);
  }

  /// The worker ended (EOF or failed send): reap it and say how.
  [[noreturn]] void worker_died(const std::string& entry) {
    auto end = worker.wait_for_exit(std::chrono::milliseconds(2000));
    if (!end) end = worker.kill_and_reap();
    fail(end->reason, entry, end->text + " during '" + entry + "'");
  }

  sandbox_reply call(std::string_view entry_view, const sandbox_request& request) {
    const std::string entry(entry_view);
    std::lock_guard lock(mutex);
    if (!worker.running()) {
      const auto started = clock_type::now();
      if (auto failure = start_worker(); !failure.empty())
        throw sandbox_error(sandbox_failure::start_failed, "sandbox::call(\"" + entry + "\")",
                            "sandbox '" + name + "': starting worker " + worker_path.string() +
                                " for " + options.library.string() + " failed: " + failure,
                            false, clock_type::now() - started);
    }
    protocol::call_message message;
    message.entry = entry;
    message.request.assign(request.bytes.begin(), request.bytes.end());
    message.reply_capacity = request.reply_capacity;
    std::vector<int> fds;
    std::vector<std::uint64_t> sent_ids;
    for (const sandbox_share& share : request.buffers) {
      const auto it = shares.find(share.id());
      if (it == shares.end())
        throw sandbox_error(sandbox_failure::buffer_import_failed,
                            "sandbox::call(\"" + entry + "\")",
                            who() + ": buffer " + detail::hex(share.host_address()) +
                                " is not shared with this sandbox",
                            false, {});
      auto& b = it->second;
      const bool has_fd = b.mapped_generation != generation;
      message.buffers.push_back({it->first, b.size, b.host_address, has_fd, b.device});
      if (has_fd) {
        fds.push_back(b.fd.get());
        sent_ids.push_back(it->first);
      }
    }
    try {
      protocol::send_frame(worker.socket(), protocol::message_type::call, protocol::encode(message),
                           fds);
    } catch (const std::system_error&) {
      worker_died(entry);
    } catch (const protocol::protocol_violation& e) {
      throw sandbox_error(sandbox_failure::protocol, "sandbox::call(\"" + entry + "\")",
                          who() + ": cannot send the call: " + e.what(), false, {});
    }

    const auto timeout = request.timeout.count() > 0 ? request.timeout : options.call_timeout;
    protocol::frame f;
    protocol::receive_status status;
    try {
      status = protocol::receive_frame(worker.socket(), f, clock_type::now() + timeout);
    } catch (const protocol::protocol_violation& e) {
      fail(sandbox_failure::protocol, entry,
           "malformed reply to '" + entry + "': " + e.what() + "; worker killed");
    } catch (const std::system_error&) {
      worker_died(entry);
    }
    if (status == protocol::receive_status::timed_out) {
      const pid_t pid = worker.pid();  // fail() kills it
      fail(sandbox_failure::timed_out, entry,
           "'" + entry + "' did not return within " + std::to_string(timeout.count()) +
               " ms; worker pid " + std::to_string(pid) + " killed (SIGKILL)");
    }
    if (status == protocol::receive_status::closed) worker_died(entry);

    try {
      switch (f.type) {
        case protocol::message_type::result: {
          auto result = protocol::decode_result(f.payload);
          for (auto id : sent_ids)
            if (auto it = shares.find(id); it != shares.end())
              it->second.mapped_generation = generation;
          return {result.status, std::move(result.reply)};
        }
        case protocol::message_type::call_failed: {
          const auto failed = protocol::decode_call_failed(f.payload);
          const auto reason = failed.reason == protocol::call_failure::no_such_entry
                                  ? sandbox_failure::no_such_entry
                              : failed.reason == protocol::call_failure::buffer_import
                                  ? sandbox_failure::buffer_import_failed
                                  : sandbox_failure::protocol;
          if (reason == sandbox_failure::protocol)
            fail(reason, entry, "the worker refused the call: " + failed.detail);
          throw sandbox_error(reason, "sandbox::call(\"" + entry + "\")",
                              who() + ": " + failed.detail, false, {});
        }
        case protocol::message_type::cuda_fault: {
          const auto fault = protocol::decode_cuda_fault(f.payload);
          const pid_t pid = worker.pid();
          if (!worker.wait_for_exit(std::chrono::milliseconds(5000))) worker.kill_and_reap();
          fail(sandbox_failure::cuda_fault, entry,
               "'" + fault.entry + "' (returned " + std::to_string(fault.entry_status) +
                   ") broke CUDA in worker pid " + std::to_string(pid) + ": " + fault.name +
                   " (CUresult " + std::to_string(fault.code) +
                   "); the worker ended itself, the host's contexts are another process's");
        }
        default:
          break;
      }
    } catch (const protocol::protocol_violation& e) {
      fail(sandbox_failure::protocol, entry,
           "malformed reply to '" + entry + "': " + e.what() + "; worker killed");
    }
    fail(sandbox_failure::protocol, entry,
         "unexpected message type " + std::to_string(static_cast<int>(f.type)) + " in reply to '" +
             entry + "'; worker killed");
  }

  void unshare(std::uint64_t id) noexcept {
    std::lock_guard lock(mutex);
    const auto it = shares.find(id);
    if (it == shares.end()) return;
    if (worker.running() && it->second.mapped_generation == generation) {
      try {
        protocol::send_frame(worker.socket(), protocol::message_type::unshare,
                             protocol::encode(protocol::unshare_message{id}));
      } catch (...) {
        // A dead worker took its mappings with it; the next call notices the death.
      }
    }
    shares.erase(it);
  }
};

// --- sandbox ------------------------------------------------------------------------------------

std::filesystem::path sandbox::default_worker() {
  if (const char* env = std::getenv("CUBRIDGE_SANDBOX_WORKER"); env && *env) return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto beside = self.parent_path() / "cubridge-sandbox-worker";
    if (is_executable(beside)) return beside;
  }
  return CUBRIDGE_SANDBOX_WORKER_INSTALLED;
}

sandbox sandbox::start(sandbox_options options) {
  auto s = std::make_shared<state>(std::move(options));
  s->name = s->options.name.empty() ? s->options.library.filename().string() : s->options.name;
  s->worker_path = s->options.worker.empty() ? default_worker() : s->options.worker;
  const std::string call = "sandbox::start";
  if (!is_executable(s->worker_path))
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': worker " + s->worker_path.string() +
                            " is not an executable file (set sandbox_options::worker or "
                            "CUBRIDGE_SANDBOX_WORKER)",
                        false, {});
  if (!std::filesystem::exists(s->options.library))
    throw sandbox_error(
        sandbox_failure::start_failed, call,
        "sandbox '" + s->name + "': library " + s->options.library.string() + " does not exist",
        false, {});
  std::lock_guard lock(s->mutex);
  if (auto failure = s->start_worker(); !failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': worker " + s->worker_path.string() + " for " +
                            s->options.library.string() + ": " + failure,
                        false, {});
  return sandbox(std::move(s));
}

sandbox::sandbox(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
sandbox::sandbox(sandbox&&) noexcept = default;
sandbox& sandbox::operator=(sandbox&& other) noexcept {
  if (this != &other) {
    if (state_) {
      std::lock_guard lock(state_->mutex);
      state_->worker.stop();
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

sandbox::~sandbox() {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  state_->worker.stop();
}

sandbox_reply sandbox::call(std::string_view entry, const sandbox_request& request) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "calling a moved-from sandbox");
  for (const sandbox_share& share : request.buffers)
    CUBRIDGE_EXPECTS(share.state_ == state_, "buffer " + detail::hex(share.host_address()) +
                                                 " passed to sandbox '" + state_->name +
                                                 "' is not shared with it (share it with this "
                                                 "sandbox's share())");
  return state_->call(entry, request);
}

sandbox_share sandbox::share(const shared_device_memory& memory) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "sharing with a moved-from sandbox");
  auto fd = memory.export_fd();
  std::lock_guard lock(state_->mutex);
  const std::uint64_t id = state_->next_share_id++;
  state_->shares.emplace(id, state::shared_buffer{std::move(fd), memory.size_bytes(),
                                                  memory.address(), memory.device().ordinal(), 0});
  return sandbox_share(state_, id, memory.address(), memory.size_bytes());
}

void sandbox::restart() {
  CUBRIDGE_EXPECTS(state_ != nullptr, "restarting a moved-from sandbox");
  std::lock_guard lock(state_->mutex);
  if (auto outcome = state_->restart(); !outcome.failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, "sandbox::restart",
                        "sandbox '" + state_->name + "': " + outcome.failure, false,
                        outcome.duration);
}

pid_t sandbox::worker_pid() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->worker.pid();
}

std::size_t sandbox::restarts() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->restarts;
}

std::chrono::nanoseconds sandbox::last_start_duration() const noexcept {
  if (!state_) return {};
  std::lock_guard lock(state_->mutex);
  return state_->last_start;
}

std::string sandbox::worker_cuda_status() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "reading a moved-from sandbox");
  std::lock_guard lock(state_->mutex);
  return state_->cuda_status;
}

const std::string& sandbox::name() const noexcept {
  return state_->name;
}

// --- sandbox_share ------------------------------------------------------------------------------

sandbox_share::sandbox_share(sandbox_share&& o) noexcept
    : state_(std::move(o.state_)),
      id_(std::exchange(o.id_, 0)),
      host_address_(std::exchange(o.host_address_, 0)),
      size_(std::exchange(o.size_, 0)) {}

sandbox_share& sandbox_share::operator=(sandbox_share&& o) noexcept {
  if (this != &o) {
    reset();
    state_ = std::move(o.state_);
    id_ = std::exchange(o.id_, 0);
    host_address_ = std::exchange(o.host_address_, 0);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

sandbox_share::~sandbox_share() {
  reset();
}

void sandbox_share::reset() noexcept {
  if (state_) state_->unshare(id_);
  state_.reset();
  id_ = 0;
}

}  // namespace cubridge
