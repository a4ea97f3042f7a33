// cubridge::fleet alone: a fleet controller (libnats inside) tries a port where no NATS server
// listens and reports it unreachable at once; a heartbeat goes to JSON and back. No GPU, no
// server.
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/records.hpp>

#include <cstdio>

int main() {
  cubridge::fleet::heartbeat beat;
  beat.node = "n1";
  beat.versions["filters"] = 3;
  const auto parsed = cubridge::fleet::parse_heartbeat(cubridge::fleet::to_json(beat));
  if (!parsed || parsed->versions.at("filters") != 3) {
    std::printf("cubridge consumer fleet: heartbeat did not survive JSON\n");
    return 1;
  }
  try {
    cubridge::fleet::controller control({"nats://127.0.0.1:1"});
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
