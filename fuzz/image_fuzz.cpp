// libFuzzer target for cubridge::inspect_image: any input must either parse or raise
// cubridge::image_error; anything else (a crash, a sanitizer report, another exception, a
// timeout) is a bug.
#include <cubridge/core/image.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto info = cubridge::inspect_image(bytes);
    // Exercise the compatibility checks on whatever was found.
    for (int major : {7, 8, 9, 10, 12})
      for (int minor : {0, 5, 9})
        (void)cubridge::can_run_on(info, cubridge::compute_capability{major, minor});
    try {
      cubridge::require_runs_on(info, cubridge::compute_capability{9, 0}, "fuzz input");
    } catch (const cubridge::image_error&) {
    }
    (void)info.find_kernel("mixed_params");
  } catch (const cubridge::image_error&) {
  }
  return 0;
}
