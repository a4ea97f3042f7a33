#pragma once
// The worker's last words: a fatal signal (SIGSEGV, SIGABRT, ...) or a library's exit() sends
// the host a dying message before the process ends, so that the host can report the failure and
// hand the call's slot to a spare at once, without waiting for the kernel to tear the process
// (and its CUDA context) down to learn the exit status.

namespace cubridge_worker {

/// Installs the signal handlers (on an alternate stack, so that a stack overflow of the main
/// thread is reported too); each sends its message once, then lets the signal end the process
/// as it would have.
void report_fatal_signals(int socket);

/// Registers an on_exit handler that reports the status a library passes to exit(). Call after
/// the library and CUDA were loaded, so that it runs before their own exit handlers.
void report_exit(int socket);

}  // namespace cubridge_worker
