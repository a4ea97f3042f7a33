// The cubridge command.
#include "doctor.hpp"
#include "exit_codes.hpp"

#include <cubridge/error.hpp>
#include <cubridge/image.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  using namespace cubridge::tool;
  CLI::App app{"cubridge: CUDA Driver API and Runtime API together"};
  app.require_subcommand(1);

  auto* doctor = app.add_subcommand("doctor", "Devices, driver, runtime, loading mode and JIT cache");
  bool json = false;
  doctor->add_flag("--json", json, "Print the report as JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_ok : exit_usage;
  }

  try {
    if (doctor->parsed()) {
      const auto report = diagnose();
      if (json)
        std::cout << report.dump(2) << "\n";
      else
        std::cout << render_table(report);
      if (!report["driver"]["available"].get<bool>()) {
        std::cerr << "cubridge: " << report["driver"]["reason"].get<std::string>() << "\n";
        return exit_no_driver;
      }
    }
  } catch (const cubridge::driver_unavailable& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_no_driver;
  } catch (const std::exception& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_failure;
  }
  return exit_ok;
}
