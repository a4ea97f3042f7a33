#pragma once
// Exit codes of the cubridge command, the same for every subcommand (docs/update-endpoint.md,
// "From the command line", says which case gets which).
namespace cubridge::tool {
inline constexpr int exit_ok = 0;
/// The command ran and found a problem: bad input file (missing, not a regular file, too large,
/// malformed, a secret key others may read), the endpoint refused, or its TLS certificate is not
/// trusted (reached, but not proven to be the endpoint: retrying will not help).
inline constexpr int exit_failure = 1;
/// A bad command line (EX_USAGE): unknown option, bad --version, --expires or URL, an output that
/// is one of the inputs.
inline constexpr int exit_usage = 64;
inline constexpr int exit_no_driver = 69;  ///< no CUDA driver or no GPU (EX_UNAVAILABLE)
/// `push`: no answer from the endpoint (EX_TEMPFAIL): nothing listening, a timeout, the
/// connection dropped, no TLS handshake.
inline constexpr int exit_unreachable = 75;
}  // namespace cubridge::tool
