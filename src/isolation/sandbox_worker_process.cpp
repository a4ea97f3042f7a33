#include "sandbox_worker_process.hpp"

#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

namespace cubridge::sandbox_internal {

namespace protocol = detail::sandbox_protocol;
using clock_type = std::chrono::steady_clock;

std::string worker_process::start(const worker_launch& launch, std::string& cuda_status) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    return std::string("socketpair failed: ") + std::strerror(errno);
  unique_fd host_end(pair[0]);
  const unique_fd worker_socket(pair[1]);
  // Only the socket, at 3, and the host's 0-2 reach the worker: an inherited socket of another
  // sandbox would keep that worker from seeing its host go away.
  detail::child_spec spec{launch.worker.string(),
                          {"--socket=3", "--library=" + launch.library.string(),
                           "--device=" + std::to_string(launch.device),
                           std::string("--cuda=") + (launch.initialize_cuda ? "1" : "0")},
                          detail::current_environment(),
                          {{3, worker_socket.get()}},
                          {}};
  try {
    process_ = detail::child_process::spawn(spec);
  } catch (const error& e) {
    return "could not execute " + e.involved();
  }
  socket_ = std::move(host_end);
  return await_ready(launch, cuda_status);
}

std::string worker_process::await_ready(const worker_launch& launch, std::string& cuda_status) {
  protocol::frame f;
  std::string failure;
  try {
    const auto status =
        protocol::receive_frame(socket(), f, clock_type::now() + launch.start_timeout);
    if (status == protocol::receive_status::ok && f.type == protocol::message_type::ready) {
      cuda_status = protocol::decode_ready(f.payload).cuda_status;
      return {};
    }
    if (status == protocol::receive_status::timed_out) {
      failure = "the worker did not report ready within " +
                std::to_string(launch.start_timeout.count()) + " ms; killed";
    } else if (status == protocol::receive_status::closed) {
      auto end = wait_for_exit(std::chrono::milliseconds(2000));
      failure = end ? end->text : "the worker closed its socket";
    } else if (f.type == protocol::message_type::start_failed) {
      failure = protocol::decode_start_failed(f.payload).reason;
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

void worker_process::stop(std::chrono::milliseconds grace) noexcept {
  if (!running()) return;
  socket_.reset();
  (void)wait_for_exit(grace);
  if (running()) (void)kill_and_reap();
}

worker_end worker_process::kill_and_reap() noexcept {
  if (!running()) return {sandbox_failure::crashed, "no worker", -1};
  const pid_t pid = process_.pid();
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
  worker_end end;
  end.text = "worker pid " + std::to_string(pid) + " " + exit.describe();
  if (exit.signaled())
    end.reason = exit.signal == SIGABRT ? sandbox_failure::aborted : sandbox_failure::crashed;
  if (exit.exited()) end.exit_code = exit.exit_code;
  return end;
}

}  // namespace cubridge::sandbox_internal
