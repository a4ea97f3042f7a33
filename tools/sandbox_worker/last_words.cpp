#include "last_words.hpp"

#include <cubridge/isolation/detail/sandbox_protocol.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>

namespace cubridge_worker {

namespace {

namespace protocol = cubridge::detail::sandbox_protocol;

int report_socket = -1;
std::atomic_flag reported = ATOMIC_FLAG_INIT;  // one message, whoever dies first
constexpr std::array fatal_signals{SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS};

/// Async-signal-safe: a frame on the stack, one send().
void send_last_words(protocol::dying_cause cause, int value) noexcept {
  if (report_socket < 0 || reported.test_and_set()) return;
  std::array<std::byte, protocol::dying_frame_bytes> frame{};
  protocol::encode_dying_frame({cause, value}, frame);
  std::size_t done = 0;
  while (done < frame.size()) {
    const ssize_t n = ::send(report_socket, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void on_fatal_signal(int signal) {
  send_last_words(protocol::dying_cause::signal, signal);
  // SA_RESETHAND restored the default action: raised again, the signal ends the process (a
  // fault would also recur on return, but a signal sent with kill() or raise() would not).
  ::raise(signal);
}

void on_exit_called(int status, void*) {
  send_last_words(protocol::dying_cause::exit, status);
}

}  // namespace

void report_fatal_signals(int socket) {
  report_socket = socket;
  static std::array<char, std::size_t{64} * 1024> alternate_stack;
  stack_t stack{};
  stack.ss_sp = alternate_stack.data();
  stack.ss_size = alternate_stack.size();
  ::sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_handler = on_fatal_signal;
  // The flags are unsigned constants; sa_flags is an int.
  action.sa_flags = static_cast<int>(SA_RESETHAND | SA_NODEFER | SA_ONSTACK);
  sigemptyset(&action.sa_mask);
  for (const int s : fatal_signals) ::sigaction(s, &action, nullptr);
}

void report_exit(int socket) {
  report_socket = socket;
  ::on_exit(on_exit_called, nullptr);
}

}  // namespace cubridge_worker
