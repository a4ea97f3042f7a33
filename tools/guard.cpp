// `cubridge guard -- PROGRAM`: exec PROGRAM with the reset guard first in LD_PRELOAD.
#include "guard.hpp"

#include "exit_codes.hpp"

#include <cubridge/core/installation.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string_view>

namespace cubridge::tool {

guard_command::guard_command(CLI::App& app) {
  command_ = app.add_subcommand(
      "guard",
      "Run a program under the reset guard: cubridge guard [--policy P] -- PROGRAM [ARGS]");
  command_
      ->add_option("--policy", policy_,
                   "What a device reset gets: deny (the default), log or allow "
                   "(CUBRIDGE_RESET_POLICY)")
      ->check(CLI::IsMember({"deny", "log", "allow"}));
  command_->add_option("--log", log_, "Append the guard's lines to this file (CUBRIDGE_RESET_LOG)");
  // Everything from PROGRAM on is the program's, options included.
  command_->prefix_command();
  command_->allow_extras();
  command_->footer(
      "The guard is found as the sandbox finds it (cubridge doctor shows which): "
      "$CUBRIDGE_RESET_GUARD, else beside cubridge or in its install tree. The program can check "
      "cubridge::reset_guard_state().");
}

int guard_command::take_program(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) != "guard") return argc;
  for (int i = 2; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") {
      program_.assign(argv + i + 1, argv + argc);
      return i;
    }
  return argc;
}

int guard_command::run() {
  // After `--`, or from the first argument that is not guard's own (CLI11's prefix command).
  auto program = program_.empty() ? command_->remaining() : program_;
  if (program.empty()) {
    std::cerr << "cubridge guard: no program given (cubridge guard -- PROGRAM [ARGS...])\n";
    return exit_usage;
  }
  const auto guard = locate(helper_file::reset_guard);
  if (!guard.found) {
    std::cerr << "cubridge guard: the reset guard is not at " << guard.path.string() << " ("
              << guard.found_by << "): install cubridge with it, or set CUBRIDGE_RESET_GUARD\n";
    return exit_failure;
  }
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string value =
      guard.path.string() + (preload && *preload ? " " + std::string(preload) : "");
  if (::setenv("LD_PRELOAD", value.c_str(), 1) != 0 ||
      (!policy_.empty() && ::setenv("CUBRIDGE_RESET_POLICY", policy_.c_str(), 1) != 0) ||
      (!log_.empty() && ::setenv("CUBRIDGE_RESET_LOG", log_.c_str(), 1) != 0)) {
    std::cerr << "cubridge guard: cannot set the environment: " << std::strerror(errno) << "\n";
    return exit_failure;
  }
  std::vector<char*> argv;
  argv.reserve(program.size() + 1);
  for (auto& a : program) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int e = errno;
  std::cerr << "cubridge guard: cannot run '" << program.front() << "': " << std::strerror(e)
            << "\n";
  return e == ENOENT ? 127 : 126;  // as a shell says "not found" and "not executable"
}

}  // namespace cubridge::tool
