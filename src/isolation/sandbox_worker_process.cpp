#include "sandbox_worker_process.hpp"

#include <cubridge/core/detail/process_tree.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

namespace cubridge::sandbox_internal {

namespace protocol = detail::sandbox_protocol;
using clock_type = std::chrono::steady_clock;

namespace {
/// How worker `pid` ended, as the sandbox reports it: its exit in words, the failure reason a
/// signal means (SIGABRT: aborted, any other: crashed), the exit code of an exit.
worker_end end_of(pid_t pid, const detail::child_exit& exit) {
  worker_end end;
  end.text = "worker pid " + std::to_string(pid) + " " + exit.describe();
  if (exit.signaled())
    end.reason = exit.signal == SIGABRT ? sandbox_failure::aborted : sandbox_failure::crashed;
  if (exit.exited()) end.exit_code = exit.exit_code;
  return end;
}
}  // namespace

/// The exit a worker announced in its last words.
detail::child_exit claimed_exit(const protocol::dying_message& m) {
  detail::child_exit exit;
  if (m.cause == protocol::dying_cause::signal) {
    exit.how = detail::child_exit::kind::signaled;
    exit.signal = m.value;
  } else {
    exit.how = detail::child_exit::kind::exited;
    exit.exit_code = m.value;
  }
  return exit;
}

/// The end a worker announced in its last words, read as the exit it is about to make.
worker_end last_words(pid_t pid, const protocol::dying_message& m) {
  return end_of(pid, claimed_exit(m));
}

worker_end worker_process::confirm_last_words(const protocol::dying_message& words,
                                              std::chrono::milliseconds grace) {
  const pid_t pid = process_.pid();
  const std::string claim = claimed_exit(words).describe();
  if (auto end = wait_for_exit(grace)) {
    if (end->text != last_words(pid, words).text) end->text += " (it had said: " + claim + ")";
    return *end;
  }
  auto end = kill_and_reap();
  end.reason = sandbox_failure::protocol;
  end.text = "worker pid " + std::to_string(pid) + " said it " + claim + " but ran on for " +
             std::to_string(grace.count()) + " ms; killed (SIGKILL)";
  return end;
}

int wait_socket_or_cancel(int socket, int cancel_fd, clock_type::time_point deadline) noexcept {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return 0;
    pollfd p[2] = {{socket, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
    const int n = ::poll(p, cancel_fd >= 0 ? 2 : 1,
                         static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n < 0 && errno != EINTR) return 1;  // let the read report the socket's error
    if (n <= 0) continue;
    if (cancel_fd >= 0 && p[1].revents) return -1;
    if (p[0].revents) return 1;
  }
}

std::string worker_process::start(const worker_launch& launch, std::string& cuda_status) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    return std::string("socketpair failed: ") + std::strerror(errno);
  unique_fd host_end(pair[0]);
  unique_fd worker_socket(pair[1]);
  // Only the socket, at 3, and the host's 0-2 reach the worker: an inherited socket of another
  // sandbox would keep that worker from seeing its host go away.
  detail::child_spec spec{launch.worker.string(),
                          {"--socket=3", "--library=" + launch.library.string(),
                           "--device=" + std::to_string(launch.device),
                           std::string("--cuda=") + (launch.initialize_cuda ? "1" : "0")},
                          launch.environment,
                          {{3, worker_socket.get()}},
                          {}};
  // A group of its own: what its library starts and leaves in the group ends with the worker
  // (child_process kills the group before reaping it); what leaves the group (setsid) stays the
  // worker's descendant (it is a child subreaper) and is ended by end_descendants().
  spec.own_process_group = true;
  try {
    process_ = detail::child_process::spawn(spec);
  } catch (const error& e) {
    return "could not execute " + e.involved();
  }
  worker_socket.reset();  // the worker's alone now: its death while starting closes the socket
  socket_ = std::move(host_end);
  return await_ready(launch, cuda_status);
}

std::string worker_process::await_ready(const worker_launch& launch, std::string& cuda_status) {
  protocol::frame f;
  std::string failure;
  const auto deadline = clock_type::now() + launch.start_timeout;
  try {
    const int ready = wait_socket_or_cancel(socket(), launch.cancel_fd, deadline);
    const auto status = ready < 0 ? protocol::receive_status::closed
                                  : protocol::receive_frame(socket(), f, deadline);
    if (status == protocol::receive_status::ok && f.type == protocol::message_type::ready) {
      cuda_status = protocol::decode_ready(f.payload).cuda_status;
      return {};
    }
    if (ready < 0) {
      failure = "the start was given up: the sandbox is being destroyed";
    } else if (status == protocol::receive_status::timed_out) {
      failure = "the worker did not report ready within " +
                std::to_string(launch.start_timeout.count()) + " ms; killed";
    } else if (status == protocol::receive_status::closed) {
      auto end = wait_for_exit(std::chrono::milliseconds(2000));
      failure = end ? end->text : "the worker closed its socket";
    } else if (f.type == protocol::message_type::start_failed) {
      failure = protocol::decode_start_failed(f.payload).reason;
    } else if (f.type == protocol::message_type::dying) {
      failure = confirm_last_words(protocol::decode_dying(f.payload)).text + " while starting";
    } else {
      failure = "the worker sent message type " + std::to_string(static_cast<int>(f.type)) +
                " instead of ready";
    }
  } catch (const std::exception& e) {
    failure = std::string("bad start message: ") + e.what();
  }
  kill_and_reap();
  return failure;
}

bool worker_process::idle_and_alive() const noexcept {
  if (!running() || !socket_) return false;
  pollfd p{socket_.get(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}

void worker_process::end_descendants() noexcept {
  if (running()) (void)detail::kill_descendants(process_.pid());
}

void worker_process::stop(std::chrono::milliseconds grace) noexcept {
  if (!running()) return;
  // Before the socket closes: a worker that exits on it leaves its descendants to init.
  end_descendants();
  socket_.reset();
  (void)wait_for_exit(grace);
  if (running()) (void)kill_and_reap();
}

void worker_process::signal_kill() noexcept {
  end_descendants();
  process_.send_kill();
}

worker_end worker_process::kill_and_reap() noexcept {
  if (!running()) return {sandbox_failure::crashed, "no worker", -1};
  const pid_t pid = process_.pid();
  end_descendants();
  return ended(pid, process_.kill());
}

std::optional<worker_end> worker_process::wait_for_exit(
    std::chrono::milliseconds timeout) noexcept {
  if (!running()) return worker_end{sandbox_failure::crashed, "no worker", -1};
  const pid_t pid = process_.pid();
  const auto exit = process_.wait_for(timeout);
  if (!exit) return std::nullopt;
  return ended(pid, *exit);
}

worker_end worker_process::ended(pid_t pid, const detail::child_exit& exit) noexcept {
  socket_.reset();
  return end_of(pid, exit);
}

}  // namespace cubridge::sandbox_internal
