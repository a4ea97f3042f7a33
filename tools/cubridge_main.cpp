// The cubridge command.
#include "coldstart/coldstart.hpp"
#include "doctor.hpp"
#include "exit_codes.hpp"
#include "fleet/fleet_commands.hpp"
#include "inspect.hpp"
#include "update/update_commands.hpp"

#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

namespace {

/// The device compute capability `inspect --sm` takes, "90" or "sm_90", read by the one parser
/// (compute_capability.hpp); nullopt for anything else. A device's has no "a" or "f" suffix.
std::optional<cubridge::compute_capability> parse_sm_option(std::string_view text) {
  const auto capability = cubridge::parse_compute_capability(
      text.starts_with("sm_") ? std::string(text) : "sm_" + std::string(text));
  if (!capability || capability->variant != cubridge::arch_variant::generic) return std::nullopt;
  return capability;
}

}  // namespace

namespace {

/// The command; main() adds only the catch for what its set-up may throw.
int run(int argc, char** argv) {
  using namespace cubridge::tool;
  CLI::App app{"cubridge: CUDA Driver API and Runtime API together"};
  app.require_subcommand(1);

  auto* doctor =
      app.add_subcommand("doctor", "Devices, driver, runtime, loading mode, JIT cache and MPS");
  bool json = false;
  doctor->add_flag("--json", json, "Print the report as JSON");

  auto* inspect =
      app.add_subcommand("inspect", "What a cubin, fatbin or PTX file holds (no GPU needed)");
  std::string image_path;
  bool inspect_json = false;
  std::string check_sm;
  inspect->add_option("file", image_path, "The image file")->required();
  inspect->add_flag("--json", inspect_json, "Print the result as JSON");
  inspect
      ->add_option("--sm", check_sm,
                   "Also say whether it runs on this compute capability (e.g. 90 or sm_90)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (parse_sm_option(text)) return {};
            return "'" + text + "' is not a device compute capability: give e.g. 90 or sm_90";
          },
          "SM", "compute capability"));

  // `coldstart`, and `coldstart-probe`, the hidden child it runs once per measurement.
  coldstart::command coldstart_command(app);
  // `keygen`, `sign`, `push`: signed module bundles and the update endpoint.
  update_commands update_command(app);
#ifdef CUBRIDGE_TOOL_FLEET
  // `fleet publish | status | rollback | watch`: rollout over NATS JetStream.
  fleet_commands fleet_command(app);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_ok : exit_usage;
  }
  if (coldstart_command.parsed()) return coldstart_command.run();  // reports its own errors
  if (update_command.parsed()) return update_command.run();        // reports its own errors
#ifdef CUBRIDGE_TOOL_FLEET
  if (fleet_command.parsed()) return fleet_command.run();  // reports its own errors
#endif

  try {
    if (inspect->parsed()) {
      const auto info = cubridge::inspect_image_file(image_path);
      const auto device = check_sm.empty() ? std::nullopt : parse_sm_option(check_sm);
      if (inspect_json) {
        auto out = describe_image(info);
        if (device) out["runs_on_" + to_string(*device)] = cubridge::can_run_on(info, *device);
        std::cout << out.dump(2) << "\n";
      } else {
        std::cout << render_image(info, image_path);
        if (device) cubridge::require_runs_on(info, *device, image_path);
        if (device) std::cout << "  runs on " << to_string(*device) << "\n";
      }
    }
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

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // CLI11's set-up errors, out of memory
    std::cerr << "cubridge: " << e.what() << "\n";
    return cubridge::tool::exit_failure;
  }
}
