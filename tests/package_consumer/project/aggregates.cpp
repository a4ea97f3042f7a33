// The options and results of the core, compile, isolation, bundle, swap and update layers,
// brace-initialised
// the documented way (designated initializers naming only what differs from the defaults), built
// with the flags users build with: -Wall -Wextra -Werror, so -Wmissing-field-initializers too
// (CMakeLists.txt). Each member of a public aggregate has a default member initializer, which is
// what keeps that warning quiet. No GPU: nothing here reaches the driver.
//
// With CUBRIDGE_CONSUMER_CANARY defined (the target consumer_aggregates_canary, built only by
// run.cmake) an aggregate of this file's own leaves a member out: that build must fail, which
// shows the flags are in force and nothing of the package turns the warning off.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/compile/compile.hpp>
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/sandbox.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update/update_gate.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#ifdef CUBRIDGE_CONSUMER_CANARY
struct canary {
  int given;
  int left_out;
};
[[maybe_unused]] const canary warns{.given = 1};
#endif

int main() {
  using namespace std::chrono_literals;
  const auto stream = cubridge::stream_ref::legacy_default();
  // The launch style of README.md and docs/, and its variants.
  const cubridge::launch_config launch{.grid = {1024 / 256}, .block = {256}, .stream = stream};
  const cubridge::launch_config blocks_only{.block = {128, 2}, .stream = stream};
  const cubridge::launch_config clustered{
      .grid = {8}, .block = {128}, .stream = stream, .cluster = {2, 1, 1}};
  const cubridge::dims extent{.x = 4};
  const cubridge::load_options load{.name = "filters"};
  const cubridge::load_options unchecked{.check_target = false};
  const cubridge::occupancy_suggestion suggestion{.block_size = 256};
  // compile
  const cubridge::cuda_source source{.text = "extern \"C\" __global__ void k() {}"};
  const cubridge::source_header header{.name = "params.cuh"};
  const cubridge::compile_options compile{.architecture = "sm_90a", .defines = {{"N", "256"}}};
  const cubridge::compile_options hermetic{.search_toolkit_headers = false};
  const cubridge::ptx_link_options link{.architecture = "sm_90", .name = "filters.ptx"};
  const cubridge::build_options build{.compile = compile};
  // isolation
  const cubridge::sandbox_options sandbox{.library = "libvendor.so", .workers = 2};
  const cubridge::sandbox_options guarded{.library = "libvendor.so",
                                          .environment = {.reset_guard = true}};
  const cubridge::sandbox_request request{.reply_capacity = 4096, .timeout = 5000ms};
  const cubridge::guest_options guest{.name = "vendor-fft"};
  // bundle
  const cubridge::bundle_manifest_input manifest{.name = "filters", .version = 3};
  const cubridge::verify_limits limits{.require_expiry = true};
  // swap and update
  const cubridge::stage_options stage{.label = 7};
  const cubridge::hot_module_options hot{.origin = {.label = 1}};
  const cubridge::update_gate_options gate{.persist_state = false};
  const cubridge::update_endpoint_options endpoint{.port = 8080, .threads = 2};

  const bool defaults_kept =
      launch.dynamic_shared_bytes == 0 && blocks_only.grid == cubridge::dims{} &&
      clustered.cluster.x == 2 && extent.y == 1 && load.check_target && unchecked.name.empty() &&
      suggestion.min_grid_size == 0 && source.name == "source.cu" && header.content.empty() &&
      compile.search_toolkit_headers && !hermetic.search_toolkit_headers &&
      link.extra_options.empty() && build.cache == nullptr && sandbox.standby == 1 &&
      guarded.environment.reset_guard && request.buffers.empty() && guest.flags == 0 &&
      manifest.target.empty() && !limits.now && stage.signer.empty() && !stage.smoke_test &&
      hot.origin.signer.empty() && gate.state_file.empty() && endpoint.bind_address == "127.0.0.1";
  if (!defaults_kept) {
    std::printf("cubridge consumer aggregates: a default was not kept\n");
    return 1;
  }
  std::printf("cubridge consumer aggregates: %s\n", launch.describe().c_str());
  return 0;
}
