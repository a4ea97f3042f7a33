// cubridge::cubridge alone, from a program outside the tree: the driver loader and the image
// reader (liblz4, libzstd inside), neither of which needs a GPU.
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>

#include <array>
#include <cstdio>

int main() {
  const std::array<std::byte, 16> garbage{};
  try {
    (void)cubridge::inspect_image(garbage);
    std::printf("cubridge consumer core: 16 zero bytes were read as an image\n");
    return 1;
  } catch (const cubridge::error&) {
    // Expected: not a cubin, fatbin or PTX image.
  }
  if (!cubridge::driver::available()) {
    std::printf("cubridge consumer core: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 0;
  }
  std::printf("cubridge consumer core: driver %d\n", cubridge::driver::version());
  return 0;
}
