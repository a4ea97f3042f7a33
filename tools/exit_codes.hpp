#pragma once
// Exit codes of the cubridge command, the same for every subcommand.
namespace cubridge::tool {
inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1;     ///< the command ran and found a problem
inline constexpr int exit_usage = 64;      ///< bad command line (EX_USAGE)
inline constexpr int exit_no_driver = 69;  ///< no CUDA driver or no GPU (EX_UNAVAILABLE)
inline constexpr int exit_unreachable = 75;  ///< `push`: no answer from the endpoint (EX_TEMPFAIL)
}  // namespace cubridge::tool
