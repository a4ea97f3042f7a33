// The cubridge command.
#include "coldstart/coldstart.hpp"
#include "doctor.hpp"
#include "exit_codes.hpp"
#include "fleet/fleet_commands.hpp"
#include "guard.hpp"
#include "inspect.hpp"
#include "update/update_commands.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/version.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

using namespace cubridge::tool;

/// `inspect FILE [--json] [--sm SM] [--key PUBLIC_KEY_FILE]...`.
struct inspect_options {
  std::string image_path;
  bool json = false;
  std::string check_sm;
  std::vector<std::string> key_files;
};

int run_inspect(const inspect_options& o) {
  std::vector<cubridge::public_key> keys;
  keys.reserve(o.key_files.size());
  for (const auto& k : o.key_files) keys.push_back(cubridge::read_public_key_file(k));
  const auto inspected = inspect_file(o.image_path, keys);
  // --sm asks of the image; a bundle of CUDA source has none (the receiver compiles it).
  const auto device =
      o.check_sm.empty() || !inspected.image ? std::nullopt : parse_sm_option(o.check_sm);
  if (o.json) {
    auto out = describe_file(inspected);
    if (device)
      out["runs_on_" + to_string(*device)] = cubridge::can_run_on(*inspected.image, *device);
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  std::cout << render_file(inspected, o.image_path);
  if (device) cubridge::require_runs_on(*inspected.image, *device, o.image_path);
  if (device) std::cout << "  runs on " << to_string(*device) << "\n";
  return exit_ok;
}

int run_doctor(bool json) {
  const auto report = diagnose();
  if (json)
    std::cout << report.dump(2) << "\n";
  else
    std::cout << render_table(report);
  if (!report["driver"]["available"].get<bool>()) {
    std::cerr << "cubridge: " << report["driver"]["reason"].get<std::string>() << "\n";
    return exit_no_driver;
  }
  return exit_ok;
}

/// The command; main() adds only the catch for what its set-up may throw.
int run(int argc, char** argv) {
  CLI::App app{"cubridge: CUDA Driver API and Runtime API together"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cubridge " + std::string(cubridge::version()),
                       "Print the version and exit");

  auto* doctor =
      app.add_subcommand("doctor", "Devices, driver, runtime, loading mode, JIT cache and MPS");
  bool json = false;
  doctor->add_flag("--json", json, "Print the report as JSON");

  auto* inspect = app.add_subcommand(
      "inspect", "What a cubin, fatbin, PTX file or signed bundle holds (no GPU needed)");
  inspect_options inspected;
  inspect->add_option("file", inspected.image_path, "The image or bundle file")->required();
  inspect->add_flag("--json", inspected.json, "Print the result as JSON");
  inspect
      ->add_option("--sm", inspected.check_sm,
                   "Also say whether it runs on this compute capability (e.g. 90 or sm_90)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (parse_sm_option(text)) return {};
            return "'" + text + "' is not a device compute capability: give e.g. 90 or sm_90";
          },
          "SM", "compute capability"));
  inspect
      ->add_option("--key", inspected.key_files,
                   "Verify a bundle's signature with this public key file (repeatable)")
      ->allow_extra_args(false);  // `--key K FILE`: FILE is the file, not a second key

  // `coldstart`, and `coldstart-probe`, the hidden child it runs once per measurement.
  coldstart::command coldstart_command(app);
  // `keygen`, `sign`, `push`: signed module bundles and the update endpoint.
  update_commands update_command(app);
  // `guard -- PROGRAM`: the program with the reset guard preloaded.
  guard_command guard(app);
#ifdef CUBRIDGE_TOOL_FLEET
  // `fleet publish | status | rollback | watch`: rollout over NATS JetStream.
  fleet_commands fleet_command(app);
#endif

  try {
    app.parse(guard.take_program(argc, argv), argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_ok : exit_usage;
  }
  // Each of these reports its own errors.
  if (coldstart_command.parsed()) return coldstart_command.run();
  if (update_command.parsed()) return update_command.run();
  if (guard.parsed()) return guard.run();
#ifdef CUBRIDGE_TOOL_FLEET
  if (fleet_command.parsed()) return fleet_command.run();
#endif
  try {
    if (inspect->parsed()) return run_inspect(inspected);
    if (doctor->parsed()) return run_doctor(json);
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
