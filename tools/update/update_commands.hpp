#pragma once
// `cubridge keygen`, `cubridge sign` and `cubridge push`: make keys, sign module bundles, and push
// bundles (or roll back) to a service's update endpoint (docs/update-endpoint.md).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace cubridge::tool {

/// Registers the three subcommands on `app`; run() runs whichever was parsed.
class update_commands {
 public:
  explicit update_commands(CLI::App& app);
  update_commands(const update_commands&) = delete;
  update_commands& operator=(const update_commands&) = delete;

  /// True when the command line named keygen, sign or push.
  [[nodiscard]] bool parsed() const;
  /// Runs what was parsed and returns the exit status (tools/exit_codes.hpp): exit_ok,
  /// exit_failure (bad input file, refused by the endpoint, its TLS certificate not trusted),
  /// exit_usage (a command line wrong in a way CLI11 could not see: a bad URL or --expires, an
  /// output that is an input), exit_unreachable (no answer). Reports every error in one line on
  /// stderr. Never throws.
  [[nodiscard]] int run() const noexcept;

 private:
  CLI::App* keygen_;
  CLI::App* sign_;
  CLI::App* push_;
  struct {
    std::string out;
    bool force = false;
  } keygen_args_;
  struct {
    std::string key, name, target, file, out, expires;
    std::uint64_t version = 0;
    bool allow_readable_key = false;
  } sign_args_;
  struct {
    std::string url, file, key, name, target, rollback, ca_cert, expires;
    std::uint64_t version = 0;
    bool allow_readable_key = false;
  } push_args_;

  int keygen() const;
  int sign() const;
  int push() const;
};

}  // namespace cubridge::tool
