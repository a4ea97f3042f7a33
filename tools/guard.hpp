#pragma once
// `cubridge guard [--policy P] [--log FILE] -- PROGRAM [ARGS...]`: runs PROGRAM with the reset
// guard preloaded by its full path (ld.so ignores a bare LD_PRELOAD name it cannot find, and the
// program would run unguarded without a sign).
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace cubridge::tool {

class guard_command {
 public:
  explicit guard_command(CLI::App& app);
  /// Takes what follows `guard ... --` out of argv (CLI11 would read it as the command's own
  /// arguments); returns the argc left for CLI11.
  int take_program(int argc, char** argv);
  [[nodiscard]] bool parsed() const { return command_->parsed(); }
  /// Replaces this process with the program; returns only on failure, with the exit code.
  [[nodiscard]] int run();

 private:
  CLI::App* command_;
  std::vector<std::string> program_;
  std::string policy_;
  std::string log_;
};

}  // namespace cubridge::tool
