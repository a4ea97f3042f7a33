// cubridge::isolation alone: the sandbox names its failure reasons and refuses a worker that does
// not exist with a typed error. No GPU.
#include <cubridge/isolation/sandbox.hpp>

#include <cstdio>

int main() {
  cubridge::sandbox_options options;
  options.library = "/nonexistent/libvendor.so";
  options.worker = "/nonexistent/cubridge-sandbox-worker";
  options.initialize_cuda = false;
  try {
    auto box = cubridge::sandbox::start(options);
    std::printf("cubridge consumer isolation: a missing worker started\n");
    return 1;
  } catch (const cubridge::sandbox_error& e) {
    std::printf("cubridge consumer isolation: refused (%s)\n",
                std::string(cubridge::to_string(e.reason())).c_str());
  } catch (const cubridge::error& e) {
    std::printf("cubridge consumer isolation: refused (%s)\n", e.code_name().c_str());
  }
  return 0;
}
