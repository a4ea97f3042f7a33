// cubridge::fleet alone: a fleet controller (libnats inside) tries a port where no NATS server
// listens and reports it unreachable at once; a heartbeat goes to JSON and back, signed and
// verified. No GPU, no server.
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/signed_record.hpp>

#include <chrono>
#include <cstdio>

int main() {
  cubridge::fleet::heartbeat beat;
  beat.node = "n1";
  beat.interval = std::chrono::seconds(5);
  beat.time = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  beat.versions["filters"] = 3;
  const auto keys = cubridge::generate_keypair();
  const auto signed_beat = cubridge::fleet::sign_record(
      cubridge::fleet::record_kind::heartbeat, cubridge::fleet::to_json(beat), keys.secret_key);
  const auto opened =
      cubridge::fleet::open_record(signed_beat, cubridge::fleet::record_kind::heartbeat,
                                   cubridge::trusted_keys{keys.public_key});
  const auto parsed = opened ? cubridge::fleet::parse_heartbeat(opened->body) : std::nullopt;
  if (!parsed || parsed->versions.at("filters") != 3) {
    std::printf("cubridge consumer fleet: heartbeat did not survive signing and JSON\n");
    return 1;
  }
  try {
    cubridge::fleet::controller_options options;
    options.bus.servers = "nats://127.0.0.1:1";
    cubridge::fleet::controller control(options);
    std::printf("cubridge consumer fleet: connected to port 1?\n");
    return 1;
  } catch (const cubridge::error& e) {
    if (!e.is(cubridge::fleet_errc::unreachable)) {
      std::printf("cubridge consumer fleet: %s\n", e.what());
      return 1;
    }
    std::printf("cubridge consumer fleet: unreachable (%s)\n", e.code_name().c_str());
  }
  return 0;
}
