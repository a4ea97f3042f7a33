// A program outside the cubridge tree, built against the installed package.
#include <cubridge/driver.hpp>
#include <cubridge/image.hpp>

#include <cstdio>

int main() {
  if (!cubridge::driver::available()) {
    std::printf("cubridge consumer: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 0;
  }
  std::printf("cubridge consumer: driver %d\n", cubridge::driver::version());
  return 0;
}
